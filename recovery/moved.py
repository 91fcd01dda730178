"""The module paths of tftrun 0.1 that moved into subpackages keep importing.

``recovery`` was one flat package; its modules now live in ``recovery/ckpt``,
``recovery/control``, ``recovery/runtime`` and ``recovery/train`` (docs/architecture.md).
A script written against the old paths (``from recovery.elastic import ElasticTrainer``,
``recovery.checkpoint.CheckpointConfig``) still works: the old name is an alias of the
module at its new path, the same module object, so there is one copy of every class. ``recovery.control`` is now the control plane's
package; it still gives the names the old module of that name held (``SchedulerControl``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

__all__ = ["MOVED", "install"]

MOVED = {
    f"recovery.{old}": f"recovery.{new}" for old, new in {
        "checkpoint": "ckpt.checkpoint", "digest": "ckpt.digest", "durable": "ckpt.durable",
        "last_words": "ckpt.last_words", "layout": "ckpt.layout", "manifest": "ckpt.manifest",
        "restore": "ckpt.restore",
        "claims": "control.claims", "inject": "control.inject",
        "membership": "control.membership", "rpc": "control.rpc",
        "sched_files": "control.files", "scheduler": "control.scheduler",
        "cluster": "runtime.cluster", "group": "runtime.group", "heartbeat": "runtime.heartbeat",
        "elastic": "train.elastic", "grad_sync": "train.grad_sync", "modes": "train.modes",
        "phase": "train.phase", "replica": "train.replica", "sampler": "train.sampler",
    }.items()
}
"""Old dotted name -> the module's path now."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and loads it as the module at its new path."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system gave the module the alias's spec; it keeps its own.
        assert module.__spec__ is not None
        module.__spec__ = module.__spec__.loader_state


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (once): before the path finders, so
    that no stale file at an old path (an older install, an editable one) is found."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())
