"""The checkpoint manifest: which files are complete, and which one is the newest valid. A file is
*valid* if ``manifest.json`` lists it, its size and checksum match, and it loads with
``torch.load(weights_only=True)``; "newest" is the highest ``(epoch, step)``, never a file time."""

from __future__ import annotations

import json
import logging
import os
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any

from filelock import FileLock

from recovery.ckpt import layout
from recovery.ckpt.durable import XXH3, file_digest, write_atomic
from recovery.position import TrainPosition, step_in_epoch_of

__all__ = ["CheckpointError", "InvalidCheckpointError", "KeepRule", "CheckpointEntry",
           "CheckpointKind", "Candidate", "Manifest", "candidates", "find_checkpoint_dirs",
           "problem", "load_verified", "newest_valid", "verify_dir"]

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
    """One complete checkpoint as the manifest records it; ``seq``, the order recorded, breaks a tie of two
    files of one position. ``None`` as ``lineage``: never restored; as ``xxh3_128``: unverifiable (an older
    tftrun's ``sha256``)."""

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
    """Which periodic checkpoints a saver drops: all but the newest ``keep_max`` of its ``lineage`` and prefix
    family (``<prefix>`` and every relaunch's ``<prefix>_<n>``), the rank's earlier incarnations' included,
    since they would pile up with every relaunch."""

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


class Manifest:
    """The manifest of one checkpoint directory (one rank's), rewritten atomically under a file lock
    so that concurrent writers and a killed writer never leave it torn."""

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

    def add(self, entry: CheckpointEntry, keep: KeepRule | None = None) -> list[str]:
        """Record a durable checkpoint and forget what ``keep`` drops, in one atomic rewrite; return the names
        forgotten, oldest first, to delete only now (an unlisted file is never loaded). ``keep`` runs under
        the lock, so that it sees every other writer's update."""
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

    With ``lineage``, only that lineage's entries; unlisted files stay (invalid whatever their lineage).
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
    """Every directory at or below ``root`` (a rank's directory, a recovery path, any tree of them)
    that holds a manifest or a checkpoint file."""
    return sorted(Path(directory) for directory, _, names in os.walk(root)
                  if any(name == layout.MANIFEST_NAME or layout.parse_checkpoint_name(name) for name in names))


_FileVersion = tuple[int, int, int]
_verified: dict[str, tuple[_FileVersion, str]] = {}
"""By path: the (size, mtime_ns, inode) of the file this process last hashed there, and its checksum,
so that a rollback hashes only files written or changed since."""
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


def _checked(candidate: Candidate) -> Any:
    path = candidate.path
    reason = problem(candidate)
    if reason is not None:
        raise InvalidCheckpointError(path, reason)
    import torch  # here: reading manifests (``tftctl ckpt list``) needs no torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise InvalidCheckpointError(path, "refused: needs arbitrary unpickling (weights_only=True)") from None
    except Exception as err:  # noqa: BLE001 - any failure to read it makes it invalid
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InvalidCheckpointError(path, f"does not load: {first_line}") from None


def load_verified(path: str | os.PathLike[str]) -> Any:
    """Load one checkpoint file after checking it against its directory's manifest; InvalidCheckpointError
    if it fails any of the four checks."""
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
    """The newest valid checkpoint of a directory (of ``lineage`` if given) as ``(candidate, state)``;
    ``None`` if there is none. Every newer candidate that fails a check is skipped with one warning."""
    for candidate in candidates(directory, lineage):
        try:
            return candidate, _checked(candidate)
        except InvalidCheckpointError as err:
            logger.warning("skipping checkpoint %s: %s", err.path, err.reason)
    return None


def verify_dir(directory: str | os.PathLike[str],
               lineage: str | None = None) -> list[tuple[Candidate, str | None]]:
    """Check every candidate of a directory (of ``lineage`` if given) fully, load included, newest
    first; ``reason`` is ``None`` for a valid checkpoint."""
    results = []
    for candidate in candidates(directory, lineage):
        try:
            _checked(candidate)
            results.append((candidate, None))
        except InvalidCheckpointError as err:
            results.append((candidate, err.reason))
    return results
