"""The on-disk layout of checkpoints (docs/checkpoints.md): the one module that spells their paths and
names. Temporary names never end in ``.ckpt``, so a half-written file is never taken for a checkpoint."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from recovery.position import TrainPosition

__all__ = ["CHECKPOINT_SUFFIX", "MANIFEST_NAME", "CheckpointName", "check_prefix",
           "checkpoint_name", "parse_checkpoint_name", "run_prefix", "run_number", "rank_dir",
           "rank_of_dir", "manifest_path", "manifest_lock_path", "temp_path", "temp_owner_pid",
           "ttp_checkpoint_path", "ttp_checkpoint_name", "ttp_step_dir", "ttp_temp_dir",
           "ttp_rank_dirs", "ttp_step_dirs", "removal_path", "lineage_file", "previous_dir",
           "LINEAGE_FILE", "CHECKPOINTS_DIR", "TTP_DIR", "SCHEDULER_DIR"]

CHECKPOINT_SUFFIX = ".ckpt"
MANIFEST_NAME = "manifest.json"
CHECKPOINTS_DIR = "checkpoints"
TTP_DIR = "ttp_checkpoints"
LINEAGE_FILE = "lineage"
SCHEDULER_DIR = "scheduler"
PREVIOUS_DIR = "previous"
_TTP_STEP_PREFIX = "tft_saved_checkpoints-step_"
_TEMP_SUFFIX = ".tmp"

# The prefix is greedy, so it may itself contain '-' and '_'; epoch and step are the
# last two numbers. "lenet_3-2_1875.ckpt" is prefix "lenet_3", epoch 2, step 1875.
_NAME = re.compile(r"^(?P<prefix>.+)-(?P<epoch>\d+)_(?P<step>\d+)\.ckpt$")
_RANK_DIR = re.compile(r"^rank_(?P<rank>\d+)$")
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp$")


@dataclass(frozen=True)
class CheckpointName:
    """The parts of ``<prefix>-<epoch>_<step>.ckpt`` (its step counts within the epoch)."""

    prefix: str
    epoch: int
    step_in_epoch: int


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if checkpoint names can start with it; raise ValueError otherwise."""
    if not prefix or os.sep in prefix or prefix.startswith("."):
        raise ValueError(f"checkpoint prefix {prefix!r} must be a non-empty file name not starting with '.'")
    return prefix


def checkpoint_name(prefix: str, position: TrainPosition) -> str:
    """Return ``<prefix>-<epoch>_<step>.ckpt`` for a checkpoint at ``position``; ValueError for a bad
    prefix or a negative epoch or step."""
    check_prefix(prefix)
    if position.epoch < 0 or position.step_in_epoch < 0:
        raise ValueError(f"epoch and step must be >= 0, got epoch={position.epoch} "
                         f"step={position.step_in_epoch}")
    return f"{prefix}-{position.epoch}_{position.step_in_epoch}{CHECKPOINT_SUFFIX}"


def parse_checkpoint_name(name: str) -> CheckpointName | None:
    """Split a checkpoint file name into its parts; ``None`` if it is not one."""
    match = _NAME.match(name)
    if match is None:
        return None
    return CheckpointName(match["prefix"], int(match["epoch"]), int(match["step"]))


def run_prefix(prefix: str, existing_names: Iterable[str]) -> str:
    """The prefix a new run writes with, so that it never overwrites an earlier run (MindSpore's rule):
    ``<prefix>_<n>`` if ``existing_names`` hold checkpoints of ``<prefix>`` (``k`` = 0) or ``<prefix>_<k>``,
    ``n`` one more than the largest ``k``."""
    highest = -1
    for name in existing_names:
        parsed = parse_checkpoint_name(name)
        run = None if parsed is None else run_number(parsed.prefix, prefix)
        if run is not None:
            highest = max(highest, run)
    return prefix if highest < 0 else f"{prefix}_{highest + 1}"


def run_number(prefix: str, asked: str) -> int | None:
    """Which run of ``asked`` writes with ``prefix`` (:func:`run_prefix`): 0 for ``asked``
    itself, ``n`` for ``<asked>_<n>``, ``None`` for a prefix of another family."""
    match = re.fullmatch(re.escape(asked) + r"(?:_(?P<n>\d+))?", prefix)
    return None if match is None else int(match["n"] or 0)


def rank_dir(recovery_path: str | os.PathLike[str], rank: int) -> Path:
    """The default directory of one rank's periodic checkpoints."""
    return Path(recovery_path) / CHECKPOINTS_DIR / f"rank_{rank}"


def rank_of_dir(directory: str | os.PathLike[str]) -> int | None:
    """The rank a ``rank_<r>`` directory belongs to, or ``None`` for any other name."""
    match = _RANK_DIR.match(Path(directory).name)
    return None if match is None else int(match["rank"])


def manifest_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / MANIFEST_NAME


def manifest_lock_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / f"{MANIFEST_NAME}.lock"


def temp_path(final: str | os.PathLike[str], tag: str = "") -> Path:
    """Where ``final`` is written before its atomic rename: a new hidden name at every call, holding
    the owner's pid; ``tag`` tells apart several writers in one process."""
    final = Path(final)
    tagged = f"{final.name}.{tag}" if tag else final.name
    # A random part, as mkstemp's: nobody can plant a link at the name ahead of the writer.
    return final.with_name(f".{tagged}.{secrets.token_hex(4)}.{os.getpid()}{_TEMP_SUFFIX}")


def spare_path(directory: str | os.PathLike[str]) -> Path:
    """Where this process keeps a pruned checkpoint file for its next save to overwrite: one name per
    process, so that the next save finds it. It is only renamed, then opened with ``O_NOFOLLOW``."""
    return Path(directory) / f".spare.{os.getpid()}{_TEMP_SUFFIX}"


def temp_owner_pid(name: str) -> int | None:
    """The pid of the process that writes the temporary file ``name``; ``None`` if not one."""
    match = _TEMP.match(name)
    return None if match is None else int(match["pid"])


def ttp_checkpoint_path(recovery_path: str | os.PathLike[str], rank: int, position: TrainPosition) -> Path:
    """Where ``rank``'s last-words (TTP) checkpoint at ``position`` is written."""
    return ttp_step_dir(recovery_path, position) / f"rank_{rank}" / ttp_checkpoint_name(rank, position)


def ttp_checkpoint_name(rank: int, position: TrainPosition) -> str:
    """The file name of ``rank``'s last-words checkpoint: ``ttp_rank_<r>-<epoch>_<step>.ckpt``."""
    return checkpoint_name(f"ttp_rank_{rank}", position)


def ttp_step_dir(recovery_path: str | os.PathLike[str], position: TrainPosition) -> Path:
    """The directory of every rank's last-words checkpoint of one step (its global step)."""
    return Path(recovery_path) / TTP_DIR / f"{_TTP_STEP_PREFIX}{position.global_step}"


def ttp_temp_dir(recovery_path: str | os.PathLike[str], position: TrainPosition) -> Path:
    """Where a step's last-words checkpoints are written before the directory is renamed: a hidden
    name, so that a save cut short leaves no directory that looks like a checkpoint."""
    final = ttp_step_dir(recovery_path, position)
    return final.with_name(f".{final.name}.{os.getpid()}{_TEMP_SUFFIX}")


def ttp_rank_dirs(recovery_path: str | os.PathLike[str], rank: int) -> list[Path]:
    """``rank``'s directories of every complete last-words save (:func:`ttp_step_dirs`), any order."""
    return [step / f"rank_{rank}" for step in ttp_step_dirs(recovery_path).values() if (step / f"rank_{rank}").is_dir()]


def ttp_step_dirs(recovery_path: str | os.PathLike[str]) -> dict[int, Path]:
    """Every complete last-words step directory, by its global step."""
    root = Path(recovery_path) / TTP_DIR
    if not root.is_dir():
        return {}
    return {int(name[len(_TTP_STEP_PREFIX):]): root / name for name in os.listdir(root)
            if name.startswith(_TTP_STEP_PREFIX) and name[len(_TTP_STEP_PREFIX):].isdigit()}


def removal_path(path: str | os.PathLike[str]) -> Path:
    """Where a directory is renamed to before it is deleted, so that it vanishes at once under its own name."""
    return temp_path(path, tag="removed")


def lineage_file(directory: str | os.PathLike[str]) -> Path:
    """Where a recovery path, or a last-words step directory, records its lineage id."""
    return Path(directory) / LINEAGE_FILE


def previous_dir(recovery_path: str | os.PathLike[str]) -> Path:
    """The folder of earlier jobs' state moved aside: ``previous/<n>/`` below it."""
    return Path(recovery_path) / PREVIOUS_DIR
