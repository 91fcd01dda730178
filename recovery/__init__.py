"""The library a training script imports to survive faults under tftrun.

See docs/ for the recovery modes. Nothing here imports the launcher, typer or rich.
"""

from __future__ import annotations

import importlib
from typing import Any

from recovery.env import WorkerEnv

# Imported on first use (PEP 562), so that the launcher, which imports recovery.env,
# does not pay for importing torch.
_LAZY = {
    "CheckpointConfig": "recovery.ckpt.checkpoint",
    "CheckpointSaver": "recovery.ckpt.checkpoint",
    "CheckpointError": "recovery.ckpt.manifest",
    "InvalidCheckpointError": "recovery.ckpt.manifest",
    "WorldSizeMismatchError": "recovery.ckpt.restore",
    "TrainPosition": "recovery.position",
    "Stateful": "recovery.stateful",
    "GlobalRngState": "recovery.rng",
    "ResumePoint": "recovery.ckpt.restore",
    "load_checkpoint": "recovery.ckpt.restore",
    "restore_checkpoint": "recovery.ckpt.restore",
    "resume": "recovery.ckpt.restore",
    "ResumableDistributedSampler": "recovery.train.sampler",
    "all_reduce_gradients": "recovery.train.grad_sync",
    "init": "recovery.runtime.cluster",
    "ClusterContext": "recovery.runtime.cluster",
    "ClusterError": "recovery.runtime.cluster",
    "restartable": "recovery.runtime.restartable",
    "attach": "recovery.train.attach",
    "ElasticTrainer": "recovery.train.elastic",
    "wrap_optimizer": "recovery.train.phase",
    "DeviceError": "recovery.faults",
    "TftModes": "recovery.train.modes",
}

# Callbacks for the frameworks (docs/frameworks.md): ``recovery.lightning.LastWordsCheckpoint``
# after a plain ``import recovery``; they import their framework, so only on first use.
_FRAMEWORK_MODULES = ("lightning", "hf")

__all__ = ["WorkerEnv", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _FRAMEWORK_MODULES:
        return importlib.import_module(f"recovery.{name}")
    if name not in _LAZY:
        raise AttributeError(f"module 'recovery' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
