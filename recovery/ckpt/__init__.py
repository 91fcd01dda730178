"""Checkpoints: durable writing, manifests, lineage, the on-disk layout, restoring, last words.

Nothing here knows about training: the objects a checkpoint saves are seen only through
the state_dict()/load_state_dict() protocol (recovery.stateful)."""
