"""The last-words checkpoint (TTP): a healthy replica saves every rank's state of its last step. In
data parallelism every rank holds the same state, so any consistent survivor can write every rank's
files, the dead one's too; they differ only in their ``rank`` field."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from recovery.ckpt import layout
from recovery.ckpt.checkpoint import CheckpointSaver, write_checkpoint
from recovery.ckpt.durable import fsync_dir, remove_stale_temps
from recovery.ckpt.lineage import LineageError, read_lineage, record_lineage, set_aside
from recovery.ckpt.manifest import CheckpointKind, Manifest
from recovery.position import TrainPosition

__all__ = ["save_last_words"]

logger = logging.getLogger(__name__)


def _lineage_of(step_dir: Path) -> str | None:
    try:
        return read_lineage(step_dir)
    except LineageError:
        return None


def save_last_words(saver: CheckpointSaver, recovery_path: str | os.PathLike[str],
                    position: TrainPosition, world_size: int) -> Path:
    """Write the current state, which must be that of ``position``, as every rank's last-words checkpoint;
    return the step directory. One there already is kept if of this lineage, else moved to
    ``previous/<n>/``."""
    final = layout.ttp_step_dir(recovery_path, position)
    if final.is_dir():
        if _lineage_of(final) == saver.lineage:
            return final
        moved = set_aside(recovery_path, [final])
        logger.warning("moved %s, another job's last words, to %s", final, moved)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(final.parent)
    temp = layout.ttp_temp_dir(recovery_path, position)
    try:
        state = saver.state(position)
        for rank in range(world_size):
            directory = temp / f"rank_{rank}"
            directory.mkdir(parents=True)
            name = layout.ttp_checkpoint_name(rank, position)
            write_checkpoint(directory, name, {**state, "rank": rank}, position, Manifest(directory),
                             kind=CheckpointKind.LAST_WORDS)
        record_lineage(temp, saver.lineage)
        fsync_dir(temp)
        os.rename(temp, final)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        if final.is_dir():  # another saver of the same step finished first
            return final
        raise
    fsync_dir(final.parent)
    logger.info("saved last-words checkpoints of step %d for %d ranks in %s",
                position.global_step, world_size, final)
    _prune(recovery_path, saver.lineage, saver.config.keep_checkpoint_max)
    return final


def _prune(recovery_path: str | os.PathLike[str], lineage: str, keep_max: int) -> None:
    """Delete all but the newest ``keep_max`` of ``lineage``'s last-words step directories."""
    step_dirs = layout.ttp_step_dirs(recovery_path)
    ours = sorted(global_step for global_step, path in step_dirs.items()
                  if _lineage_of(path) == lineage)
    for global_step in ours[: max(0, len(ours) - keep_max)]:
        path = step_dirs[global_step]
        doomed = layout.removal_path(path)
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            continue  # another survivor pruned it first
        fsync_dir(path.parent)
        shutil.rmtree(doomed, ignore_errors=True)
        logger.info("pruned last-words checkpoints %s (keeping the newest %d)", path, keep_max)
