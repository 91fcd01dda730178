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
    "CheckpointConfig": "recovery.checkpoint",
    "CheckpointSaver": "recovery.checkpoint",
    "CheckpointError": "recovery.manifest",
    "InvalidCheckpointError": "recovery.manifest",
    "WorldSizeMismatchError": "recovery.restore",
    "TrainPosition": "recovery.position",
    "Stateful": "recovery.stateful",
    "GlobalRngState": "recovery.rng",
    "ResumePoint": "recovery.restore",
    "load_checkpoint": "recovery.restore",
    "restore_checkpoint": "recovery.restore",
    "resume": "recovery.restore",
    "ResumableDistributedSampler": "recovery.sampler",
    "all_reduce_gradients": "recovery.grad_sync",
    "init": "recovery.cluster",
    "ClusterContext": "recovery.cluster",
    "ClusterError": "recovery.cluster",
    "ElasticTrainer": "recovery.elastic",
    "wrap_optimizer": "recovery.phase",
    "DeviceError": "recovery.faults",
    "TftModes": "recovery.modes",
}

__all__ = ["WorkerEnv", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'recovery' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
