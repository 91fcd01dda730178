"""The rollback point every rank of the group agrees on, and this rank's checkpoint there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recovery.ckpt import layout
from recovery.ckpt.checkpoint import CheckpointSaver
from recovery.ckpt.manifest import Candidate, candidates, problem
from recovery.ckpt.restore import load_checkpoint
from recovery.train.collectives import MAX_ROWS, Wait, all_gather_rows, blocking

__all__ = ["checkpoint_dirs", "agree_rollback_point", "choose_rollback"]


def checkpoint_dirs(saver: CheckpointSaver, recovery_path: str, rank: int) -> list[Path]:
    """Where this rank's checkpoints are: its periodic directory, then every last-words one."""
    return [saver.directory, *layout.ttp_rank_dirs(recovery_path, rank)]


def _valid(directories: list[Path], lineage: str) -> list[Candidate]:
    return [c for d in directories for c in candidates(d, lineage) if problem(c) is None]


def agree_rollback_point(directories: list[Path], lineage: str,
                         wait: Wait = blocking) -> tuple[int, int] | None:
    """The newest (epoch, step_in_epoch) for which *every* rank of the group has a valid checkpoint of
    ``lineage``, or ``None``; every rank computes the same answer from the newest :data:`MAX_ROWS`
    points of each, gathered over the group."""
    mine = sorted({(c.epoch, c.step_in_epoch) for c in _valid(directories, lineage)})[-MAX_ROWS:]
    everyone = all_gather_rows(mine, 2, wait)
    common = set.intersection(*(set(points) for points in everyone))
    return max(common) if common else None  # type: ignore[return-value]


def choose_rollback(directories: list[Path], lineage: str,
                    wait: Wait = blocking) -> tuple[Candidate, dict[str, Any]] | None:
    """This rank's checkpoint at the point every rank agrees on, loaded; ``None`` if none."""
    point = agree_rollback_point(directories, lineage, wait)
    if point is None:
        return None
    # A periodic one if there is, else a last-words one: directories list the periodic first.
    for candidate in _valid(directories, lineage):
        if (candidate.epoch, candidate.step_in_epoch) == point:
            return candidate, load_checkpoint(candidate.path)
    raise FileNotFoundError(f"no valid checkpoint for epoch {point[0]} step {point[1]} in {directories}")
