"""The checkpoint manifest: which files are complete, and which one is the newest valid.

Each checkpoint directory has a ``manifest.json`` listing every checkpoint written to it
completely, with its size and XXH3-128 checksum. A file is *valid* only if all of these hold:

1. it is in the manifest (a file the manifest does not list was never finished);
2. its size is the recorded size (catches truncation);
3. its checksum is the recorded one (catches bit flips);
4. it loads with ``torch.load(weights_only=True)`` (no arbitrary unpickling).

Each entry also records the job's lineage (:mod:`recovery.ckpt.lineage`) and the kind of
checkpoint (periodic or last words). Whatever chooses a checkpoint to restore asks for one
lineage's candidates: entries of any other lineage, and entries written before lineages
existed (they have none), are left out.

Check 3 reads the whole file, so its result is remembered for the life of the process,
keyed by the file's path, size, modification time and inode: a rollback hashes each
candidate at most once, and a later rollback hashes only the files written or changed
since. (A bit flip on disk that leaves the file's times alone is caught by the next
process that verifies the file; ``tftctl ckpt verify`` is one.)

"Newest" is the highest ``(epoch, step)``, never a file time. An invalid candidate newer
than the chosen one is reported with one warning line naming the file and the reason.
The manifest is rewritten atomically under a file lock, so concurrent writers and a
writer killed mid-update never leave it torn. It is read once per update, under that lock,
and parsed only when its bytes differ from what this object last read or wrote; it is
written one entry a line, by the C JSON encoder (``indent`` would take the much slower
pure-Python one).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any

from filelock import FileLock

from recovery.ckpt import layout
from recovery.ckpt.durable import XXH3, file_digest, write_atomic
from recovery.position import TrainPosition, step_in_epoch_of

__all__ = [
    "CheckpointError",
    "InvalidCheckpointError",
    "KeepRule",
    "CheckpointEntry",
    "CheckpointKind",
    "Candidate",
    "Manifest",
    "candidates",
    "find_checkpoint_dirs",
    "problem",
    "load_verified",
    "newest_valid",
    "verify_dir",
]

logger = logging.getLogger(__name__)

MANIFEST_VERSION = 1


class CheckpointError(Exception):
    """A checkpoint could not be written, found or used."""


class InvalidCheckpointError(CheckpointError):
    """A checkpoint file failed validation; ``reason`` says how."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class CheckpointKind(str, Enum):
    """Why a checkpoint was written."""

    PERIODIC = "periodic"
    """By the saver, every N steps or epochs, at the start and at the end of training."""
    LAST_WORDS = "last_words"
    """By a healthy replica after a fault, for every rank (TTP, :mod:`recovery.ckpt.last_words`)."""


@dataclass(frozen=True)
class CheckpointEntry:
    """One complete checkpoint as the manifest records it.

    ``seq`` orders entries by the time they were recorded; it only breaks a tie between
    two files of the same ``(epoch, step_in_epoch)`` (two runs with different prefixes).
    ``lineage`` is the id of the job that wrote it; ``None`` in a manifest written before
    lineages existed. ``xxh3_128`` is the file's checksum; ``None`` in an entry that holds
    only the ``sha256`` of an older tftrun, which cannot be verified.
    """

    name: str
    epoch: int
    step_in_epoch: int
    global_step: int
    rank: int
    world_size: int
    size: int
    xxh3_128: str | None
    time: float
    seq: int = 0
    lineage: str | None = None
    kind: CheckpointKind = CheckpointKind.PERIODIC

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", CheckpointKind(self.kind))  # a str when read from JSON

    @property
    def position(self) -> TrainPosition:
        """The training position the checkpoint holds."""
        return TrainPosition(self.epoch, self.step_in_epoch, self.global_step)

    def to_json(self) -> dict[str, Any]:
        """The manifest's record of the entry."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> CheckpointEntry:
        """The entry :meth:`to_json` recorded, or an older tftrun's (its ``sha256`` is
        dropped, its ``step`` is the step within the epoch)."""
        values = {key: value for key, value in record.items() if key not in ("sha256", "step")}
        return cls(**{"xxh3_128": None, **values, "step_in_epoch": step_in_epoch_of(record)})


@dataclass(frozen=True)
class Candidate:
    """A file that may be a checkpoint: listed in the manifest, present on disk, or both.

    ``kind`` is the manifest's; ``None`` for a file the manifest does not list.
    """

    path: Path
    epoch: int
    step_in_epoch: int
    entry: CheckpointEntry | None
    kind: CheckpointKind | None = None

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.epoch, self.step_in_epoch, -1 if self.entry is None else self.entry.seq)


@dataclass(frozen=True)
class KeepRule:
    """Which periodic checkpoints a saver drops: all but the newest ``keep_max`` of its
    family (the prefix it was asked for and every ``<prefix>_<n>`` of a relaunch, see
    :func:`recovery.ckpt.layout.run_prefix`) of its job's ``lineage``.

    Another job's checkpoints, those written before lineages existed and those of
    another prefix are never dropped. The checkpoints of an earlier incarnation of the
    rank are: the job resumes from the newest, and the rest would pile up with every
    relaunch.
    """

    prefix: str
    lineage: str
    keep_max: int

    def __call__(self, entries: Iterable[CheckpointEntry]) -> list[str]:
        """The names to drop of ``entries``, oldest first."""
        family = [
            entry for entry in entries
            if entry.lineage == self.lineage
            and (parsed := layout.parse_checkpoint_name(entry.name)) is not None
            and layout.run_number(parsed.prefix, self.prefix) is not None
        ]
        family.sort(key=lambda e: (e.position, e.seq))
        return [entry.name for entry in family[: max(0, len(family) - self.keep_max)]]


Keep = Callable[[Iterable[CheckpointEntry]], list[str]]
"""Given every entry, the names to drop (a :class:`KeepRule`)."""


class Manifest:
    """The manifest of one checkpoint directory.

    Args:
        directory: the checkpoint directory (one rank's).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.path = layout.manifest_path(self.directory)
        self._lock = FileLock(str(layout.manifest_lock_path(self.directory)))
        self._known: tuple[bytes, dict[str, CheckpointEntry]] = (b"", {})
        """The manifest's bytes as this object last read or wrote them, and their entries."""

    def entries(self) -> dict[str, CheckpointEntry]:
        """The recorded entries by file name; empty when there is no readable manifest."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        if data == self._known[0]:
            return dict(self._known[1])
        try:
            raw = json.loads(data)
            entries = {e["name"]: CheckpointEntry.from_json(e) for e in raw["entries"]}
        except (ValueError, KeyError, TypeError) as err:
            # Written atomically by us, so this is damage from outside: trust no file.
            logger.warning("ignoring unreadable checkpoint manifest %s: %s", self.path, err)
            return {}
        self._known = (data, entries)
        return dict(entries)

    def add(self, entry: CheckpointEntry, keep: Keep | None = None) -> list[str]:
        """Record a checkpoint that is already durable on disk, and forget what ``keep``
        drops.

        Both happen in one atomic rewrite, so a crash never leaves the old files dropped
        without the new one listed. Forget files before deleting them: an unlisted file
        left by a crash is never loaded, while a listed file that is gone is reported.
        ``keep`` is asked under the manifest's lock, with the entries just read and the
        new one (its ``seq`` set), so that it sees every other writer's update.

        Returns:
            The names forgotten, as ``keep`` gave them (oldest first).
        """
        with self._lock:
            entries = self.entries()
            entry = replace(entry, seq=1 + max((e.seq for e in entries.values()), default=0))
            entries[entry.name] = entry
            dropped = [] if keep is None else keep(entries.values())
            gone = set(dropped)
            self._write([e for name, e in entries.items() if name not in gone])
        return dropped

    def _write(self, entries: list[CheckpointEntry]) -> None:
        lines = ",\n".join(json.dumps(e.to_json()) for e in entries)
        data = f'{{"version": {MANIFEST_VERSION}, "entries": [\n{lines}\n]}}\n'.encode()
        write_atomic(self.path, lambda file: file.write(data))
        self._known = (data, {e.name: e for e in entries})


def candidates(directory: str | os.PathLike[str], lineage: str | None = None) -> list[Candidate]:
    """Every checkpoint the manifest lists or the directory holds, newest first.

    Args:
        directory: one checkpoint directory.
        lineage: list only this lineage's entries; files the manifest does not list stay
            (they are invalid whatever their lineage). ``None``: every lineage's.
    """
    directory = Path(directory)
    entries = Manifest(directory).entries()
    found = {
        name: Candidate(directory / name, entry.epoch, entry.step_in_epoch, entry, entry.kind)
        for name, entry in entries.items() if lineage is None or entry.lineage == lineage
    }
    if directory.is_dir():
        for name in os.listdir(directory):
            parsed = layout.parse_checkpoint_name(name)
            if parsed is not None and name not in entries:
                found[name] = Candidate(directory / name, parsed.epoch, parsed.step_in_epoch, None)
    return sorted(found.values(), key=lambda c: c.order, reverse=True)


def find_checkpoint_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """Every directory at or below ``root`` that holds a manifest or a checkpoint file.

    ``root`` may be one rank's directory, a ``checkpoints/`` folder of rank directories,
    a whole recovery path (periodic and last-words checkpoints alike), or any tree of them.
    """
    found = []
    for directory, _, names in os.walk(root):
        if any(name == layout.MANIFEST_NAME or layout.parse_checkpoint_name(name) for name in names):
            found.append(Path(directory))
    return sorted(found)


_FileVersion = tuple[int, int, int]
_verified: dict[str, tuple[_FileVersion, str]] = {}
"""By path: the (size, mtime_ns, inode) of the file this process last hashed there, and its
checksum."""
_VERIFIED_MAX = 1024


def _checksum(path: Path, stat: os.stat_result) -> str:
    version = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
    known = _verified.get(str(path))
    if known is not None and known[0] == version:
        return known[1]
    checksum = file_digest(path).checksum
    if len(_verified) >= _VERIFIED_MAX:  # forget the files pruned since
        for gone in [k for k in _verified if not os.path.exists(k)]:
            del _verified[gone]
    _verified[str(path)] = (version, checksum)
    return checksum


def problem(candidate: Candidate) -> str | None:
    """Why ``candidate`` fails the manifest checks (1-3), or ``None`` if it passes them."""
    if candidate.entry is None:
        return "not in the manifest (never completely written)"
    try:
        stat = candidate.path.stat()
    except FileNotFoundError:
        return "missing: listed in the manifest but not on disk"
    if stat.st_size != candidate.entry.size:
        return f"truncated or torn: {stat.st_size} bytes, the manifest says {candidate.entry.size}"
    if candidate.entry.xxh3_128 is None:
        return f"unverifiable: the manifest gives no {XXH3} (an older tftrun's entry)"
    if _checksum(candidate.path, stat) != candidate.entry.xxh3_128:
        return f"corrupt: {XXH3} differs from the manifest"
    return None


def _load(path: Path) -> Any:
    import torch  # here: reading manifests (``tftctl ckpt list``) needs no torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise InvalidCheckpointError(path, "refused: needs arbitrary unpickling (weights_only=True)") from None
    except Exception as err:  # noqa: BLE001 - any failure to read it makes it invalid
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InvalidCheckpointError(path, f"does not load: {first_line}") from None


def _checked(candidate: Candidate) -> Any:
    reason = problem(candidate)
    if reason is not None:
        raise InvalidCheckpointError(candidate.path, reason)
    return _load(candidate.path)


def load_verified(path: str | os.PathLike[str]) -> Any:
    """Load one checkpoint file after checking it against its directory's manifest.

    Raises:
        InvalidCheckpointError: the file fails any of the four checks.
    """
    path = Path(path)
    parsed = layout.parse_checkpoint_name(path.name)
    entry = Manifest(path.parent).entries().get(path.name)
    if parsed is None and entry is None:
        raise InvalidCheckpointError(path, "not a checkpoint file name (<prefix>-<epoch>_<step>.ckpt)")
    epoch, step_in_epoch = ((entry.epoch, entry.step_in_epoch) if entry is not None
                            else (parsed.epoch, parsed.step_in_epoch))  # type: ignore[union-attr]
    return _checked(Candidate(path, epoch, step_in_epoch, entry,
                              None if entry is None else entry.kind))


def newest_valid(directory: str | os.PathLike[str],
                 lineage: str | None = None) -> tuple[Candidate, Any] | None:
    """The newest valid checkpoint of a directory, loaded; ``None`` if there is none.

    Every newer candidate that fails a check is skipped with one warning line. With
    ``lineage``, only that lineage's checkpoints are candidates (:func:`candidates`).

    Returns:
        ``(candidate, state)`` where ``state`` is what the file holds.
    """
    for candidate in candidates(directory, lineage):
        try:
            return candidate, _checked(candidate)
        except InvalidCheckpointError as err:
            logger.warning("skipping checkpoint %s: %s", err.path, err.reason)
    return None


def verify_dir(directory: str | os.PathLike[str],
               lineage: str | None = None) -> list[tuple[Candidate, str | None]]:
    """Check every candidate of a directory (of ``lineage`` if given) fully, load included,
    newest first.

    Returns:
        ``(candidate, reason)`` pairs; ``reason`` is ``None`` for a valid checkpoint.
    """
    results = []
    for candidate in candidates(directory, lineage):
        try:
            _checked(candidate)
            results.append((candidate, None))
        except InvalidCheckpointError as err:
            results.append((candidate, err.reason))
    return results
