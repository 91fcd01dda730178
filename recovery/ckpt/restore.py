"""Reading checkpoints back: verified loading and a one-call resume into the user's objects.

A checkpoint is a dict of plain data and tensors; its keys are listed in docs/checkpoints.md.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from recovery import env as names
from recovery.ckpt.lineage import job_lineage
from recovery.ckpt.manifest import CheckpointError, load_verified, newest_valid
from recovery.env import WorkerEnv
from recovery.position import TrainPosition
from recovery.rng import GlobalRngState
from recovery.stateful import Stateful

__all__ = ["FORMAT", "ResumePoint", "WorldSizeMismatchError", "job_rank_and_world_size",
           "load_checkpoint", "restore_checkpoint", "resume"]

logger = logging.getLogger(__name__)

FORMAT = "tftrun-checkpoint"
FORMAT_VERSION = 1


class WorldSizeMismatchError(CheckpointError):
    """The checkpoint was written by a job of another world size."""


@dataclass(frozen=True)
class ResumePoint(TrainPosition):
    """Where to continue after :func:`resume`: epoch ``epoch`` after its first ``step_in_epoch`` steps;
    ``path``, the file restored from, is ``None`` when nothing was restored (or none was given)."""

    path: Path | None = None
    append_info: dict[str, Any] = field(default_factory=dict)


def job_rank_and_world_size() -> tuple[int, int]:
    """This process's rank and the job's size: the env contract's under a scheduler (whose process
    group may be a degraded one: docs/elastic.md), else the process group's, else the env contract's."""
    if names.MS_SCHED_PORT not in os.environ and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    env = WorkerEnv.from_env()
    return env.rank, env.world_size


def _checked_format(state: Any, path: Path) -> dict[str, Any]:
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a tftrun checkpoint (no format={FORMAT!r} key)")
    if state.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format version {state.get('version')}; "
                              f"this reads {FORMAT_VERSION}")
    return state


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load one checkpoint file, verified against its manifest, with ``weights_only=True``.

    Raises:
        InvalidCheckpointError: the file is torn, corrupt, unlisted, or needs unpickling.
        CheckpointError: the file is valid but not a tftrun checkpoint.
    """
    path = Path(path)
    return _checked_format(load_verified(path), path)


def _load_state(target: Any, state: Any, what: str, path: Path) -> None:
    if target is None:
        return
    if state is None:
        raise CheckpointError(f"{path} holds no {what} state, but a {what} was given to restore into")
    target.load_state_dict(state)


def restore_checkpoint(
    state: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler: Any = None,
    *,
    sampler: Stateful | None = None,
    rng: Stateful | None = None,
    path: Path | None = None,
    allow_world_size_change: bool = False,
) -> ResumePoint:
    """Put a loaded checkpoint (from :func:`load_checkpoint`) into the user's objects; return where to continue.

    The model loads strictly; ``rng`` defaults to :class:`~recovery.rng.GlobalRngState`; ``path`` is for messages.

    Raises:
        WorldSizeMismatchError: the world sizes differ and ``allow_world_size_change`` is not set.
        CheckpointError: an optimizer, scheduler or RNG stateful was given but the checkpoint has no state for it.
    """
    where = path or Path("the checkpoint")
    state = _checked_format(state, where)
    _, world_size = job_rank_and_world_size()
    if state["world_size"] != world_size and not allow_world_size_change:
        raise WorldSizeMismatchError(
            f"{where} was written by a job of world size {state['world_size']}, this job has "
            f"world size {world_size}: each rank's data and the gradient average would change, "
            "so resuming is refused (allow_world_size_change=True resumes anyway)"
        )
    model.load_state_dict(state["model"])
    _load_state(optimizer, state["optimizer"], "optimizer", where)
    _load_state(lr_scheduler, state["lr_scheduler"], "lr_scheduler", where)
    _load_state(rng if rng is not None else GlobalRngState(), state["rng"], "rng", where)
    point = ResumePoint(*TrainPosition.from_dict(state["position"]), path=path,
                        append_info=state["append_info"])
    if sampler is not None:
        sampler.load_state_dict({**(state["data"] or {}), "epoch": point.epoch,
                                 "step_in_epoch": point.step_in_epoch})
    return point


def resume(
    directory: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler: Any = None,
    *,
    sampler: Stateful | None = None,
    rng: Stateful | None = None,
    allow_world_size_change: bool = False,
    lineage: str | None = None,
) -> ResumePoint:
    """Restore the newest valid checkpoint of ``lineage`` (this job's by default) in ``directory`` into the
    user's objects; with none, touch nothing and return ``ResumePoint()`` (epoch 1, step 0). Other
    arguments and errors as :func:`restore_checkpoint`."""
    lineage = lineage or job_lineage()
    found = newest_valid(directory, lineage)
    if found is None:
        logger.info("no valid checkpoint of lineage %s in %s: starting from the beginning",
                    lineage, directory)
        return ResumePoint()
    candidate, state = found
    point = restore_checkpoint(
        state, model, optimizer, lr_scheduler,
        sampler=sampler, rng=rng, path=candidate.path, allow_world_size_change=allow_world_size_change,
    )
    logger.info("resumed from %s (epoch %d, step %d, global step %d)", candidate.path,
                point.epoch, point.step_in_epoch, point.global_step)
    return point
