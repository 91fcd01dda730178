"""Checkpoint manifest entries as the manifest tests write them."""

from __future__ import annotations

from recovery.ckpt.manifest import CheckpointEntry


def manifest_entry(name: str, step: int) -> CheckpointEntry:
    """The entry of checkpoint file ``name`` of epoch 1, saved at ``step``, of job ``job``."""
    return CheckpointEntry(name, 1, step, step, 0, 1, 10, "0" * 32, 1.0, lineage="job")
