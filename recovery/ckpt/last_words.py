"""The last-words checkpoint (TTP): a healthy replica saves every rank's state of step n.

In data parallelism every rank holds the same parameters and optimizer state, so when one
rank dies, any consistent survivor (not mid-update, see :mod:`recovery.train.phase`) can write
the state of its last completed step n for *every* rank, the dead one included. Ranks
differ only in what is derived from the rank and the position (the data shard, which the
sampler computes from the checkpoint's epoch and step), so the files differ only in their
``rank`` field.

The files follow the seeds' layout (:func:`recovery.ckpt.layout.ttp_checkpoint_path`), each in
a rank directory with its own manifest, so they verify and load like periodic ones; their
manifest entries say they are last words. The step directory records the job's lineage
(:mod:`recovery.ckpt.lineage`), as every file in it does. The whole step directory is written
under a hidden temporary name and renamed when complete: a saver killed half-way leaves
nothing that looks like a checkpoint.

Each save then prunes the job's older step directories by the saver's keep rule: the
newest ``keep_checkpoint_max`` stay. A pruned directory is renamed to a hidden name
first, so it vanishes whole, and then deleted.
"""

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
    """Write the current state, as of ``position``, as every rank's last-words checkpoint.

    Args:
        saver: this rank's saver (what a checkpoint holds).
        recovery_path: the job's recovery path.
        position: the last step this rank completed; the state must be that step's.
        world_size: how many ranks to write files for.

    Returns:
        The step directory. If a complete one of this job's lineage exists already for
        that step (an earlier fault at the same step), it is kept as it is; another
        lineage's is moved to ``previous/<n>/`` first.
    """
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
