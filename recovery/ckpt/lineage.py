"""Job lineage: which checkpoints belong to this job, so that a restore never picks another job's
(docs/checkpoints.md). No torch here: the launcher uses it before anything starts."""

from __future__ import annotations

import os
import re
import secrets
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from recovery.ckpt import layout
from recovery.ckpt.durable import create_atomic, create_numbered_dir, fsync_dir, write_atomic
from recovery.env import TFT_LINEAGE, WorkerEnv

__all__ = ["LineageError", "LaunchLineage", "new_lineage_id", "read_lineage", "adopt_lineage",
           "record_lineage", "job_lineage", "job_state", "set_aside", "open_lineage",
           "join_lineage", "main"]

_LINEAGE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_JOB_STATE = (layout.CHECKPOINTS_DIR, layout.TTP_DIR, layout.SCHEDULER_DIR, layout.LINEAGE_FILE)
"""What of a recovery path belongs to one job: moved aside together, never split."""
_CHECKPOINT_STATE = (layout.CHECKPOINTS_DIR, layout.TTP_DIR)


class LineageError(Exception):
    """A lineage id is malformed, or a recovery path's lineage cannot be established."""


@dataclass(frozen=True)
class LaunchLineage:
    """The lineage a launch runs in, and where an earlier job's state was moved (if it was)."""

    lineage: str
    archived: Path | None = None


def new_lineage_id() -> str:
    """A fresh lineage id: 16 random hex digits (unique, not a secret)."""
    return secrets.token_hex(8)


def _checked(lineage: str, where: str) -> str:
    if not _LINEAGE_ID.match(lineage):
        raise LineageError(f"{where} does not hold a lineage id "
                           f"(1-64 letters, digits, '_', '.', '-'): {lineage[:70]!r}")
    return lineage


def read_lineage(directory: str | os.PathLike[str]) -> str | None:
    """The lineage recorded in ``directory`` (a recovery path, a last-words step directory);
    ``None`` when none is recorded, LineageError when the file holds something else."""
    path = layout.lineage_file(directory)
    try:
        return _checked(path.read_text().strip(), str(path))
    except FileNotFoundError:
        return None


def record_lineage(directory: str | os.PathLike[str], lineage: str, *, replace: bool = False) -> str:
    """Record ``lineage`` in ``directory`` durably; return the lineage recorded there.

    Without ``replace``, a lineage already recorded (by a racing process) is kept and returned.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = f"{_checked(lineage, 'the new lineage')}\n".encode()
    if replace:
        write_atomic(layout.lineage_file(directory), lambda file: file.write(data))
        return lineage
    if create_atomic(layout.lineage_file(directory), data):
        return lineage
    return read_lineage(directory) or lineage


def adopt_lineage(recovery_path: str | os.PathLike[str]) -> str:
    """The lineage ``recovery_path`` records; a new one, recorded there, if it records none.

    Processes started together by hand race here safely: they all adopt the first one recorded.
    """
    return read_lineage(recovery_path) or record_lineage(recovery_path, new_lineage_id())


def job_lineage(env: WorkerEnv | None = None) -> str:
    """This process's lineage: ``TFT_LINEAGE``, else the one its recovery path records (started by
    hand, the recovery path is the job)."""
    env = WorkerEnv.from_env() if env is None else env
    if env.lineage:
        return _checked(env.lineage, TFT_LINEAGE)
    return adopt_lineage(env.recovery_path)


def job_state(recovery_path: str | os.PathLike[str]) -> list[Path]:
    """What ``recovery_path`` holds of the job that used it: checkpoints, last words,
    the scheduler's state and the lineage file."""
    return [path for name in _JOB_STATE if (path := Path(recovery_path) / name).exists()]


def set_aside(recovery_path: str | os.PathLike[str], paths: Iterable[Path]) -> Path | None:
    """Move ``paths`` (inside ``recovery_path``) to a new ``previous/<n>/``, each to the same
    place relative to it; return that folder, or ``None`` when there was nothing to move."""
    recovery_path = Path(recovery_path)
    paths = list(paths)
    if not paths:
        return None
    archive = create_numbered_dir(layout.previous_dir(recovery_path))
    for path in paths:
        target = archive / path.relative_to(recovery_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, target)
        fsync_dir(path.parent)
    fsync_dir(archive)
    return archive


def open_lineage(recovery_path: str | os.PathLike[str], *, resume: bool) -> LaunchLineage:
    """The lineage a launch runs in; the caller must be the only launcher of the path. ``resume``
    (``--is_recover=1``) keeps the recorded one, else an earlier job's checkpoints move to ``previous/<n>/``;
    raises LineageError for ``resume`` of a path with checkpoints but no lineage."""
    recovery_path = Path(recovery_path)
    if resume:
        found = read_lineage(recovery_path)
        if found is not None:
            return LaunchLineage(found)
        if _holds_checkpoints(recovery_path):
            raise LineageError(f"{recovery_path} holds checkpoints but records no lineage "
                               f"(written before tftrun kept lineages, or {layout.LINEAGE_FILE} "
                               "was removed): they cannot be told from another job's")
        return LaunchLineage(adopt_lineage(recovery_path))
    # Without checkpoints there is nothing to mix in: a scheduler state left behind is
    # one a new scheduler ignores anyway (another run id), so nothing is moved.
    archived = set_aside(recovery_path, job_state(recovery_path)) if _holds_checkpoints(recovery_path) else None
    return LaunchLineage(record_lineage(recovery_path, new_lineage_id(), replace=True), archived)


def join_lineage(recovery_path: str | os.PathLike[str], lineage: str) -> LaunchLineage:
    """A node other than node 0 joins node 0's ``lineage``; its recovery path's state of another
    lineage is moved to ``previous/<n>/`` first."""
    recovery_path = Path(recovery_path)
    if read_lineage(recovery_path) == _checked(lineage, "node 0's lineage"):
        return LaunchLineage(lineage)
    archived = set_aside(recovery_path, job_state(recovery_path))
    return LaunchLineage(record_lineage(recovery_path, lineage, replace=True), archived)


def _holds_checkpoints(recovery_path: Path) -> bool:
    return any((recovery_path / name).exists() for name in _CHECKPOINT_STATE)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m recovery.ckpt.lineage new|resume RECOVERY_PATH``: open the lineage of a launch
    by hand (templates/run.sh) as tftrun does, and print its id."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] not in ("new", "resume"):
        print("usage: python -m recovery.ckpt.lineage new|resume RECOVERY_PATH", file=sys.stderr)
        return 2
    try:
        opened = open_lineage(args[1], resume=args[0] == "resume")
    except (LineageError, OSError) as err:
        print(f"recovery.ckpt.lineage: error: {err}", file=sys.stderr)
        return 2
    if opened.archived is not None:
        print(f"an earlier job's checkpoints in {args[1]} were moved to {opened.archived}", file=sys.stderr)
    print(opened.lineage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
