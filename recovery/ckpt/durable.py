"""Durable writes: a file appears under its final name complete, or not at all, even after a power cut;
a killed writer leaves at most a temporary file behind."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import xxhash

from recovery.ckpt.layout import temp_owner_pid, temp_path
from recovery.safe_files import NOFOLLOW

__all__ = ["XXH3", "FileDigest", "write_atomic", "create_atomic", "fsync_dir", "file_digest",
           "remove_stale_temps", "create_numbered_dir"]

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20


XXH3 = "xxh3_128"
"""The checksum of every checkpoint file: cheap, and it need not resist an attacker, since a file
that verifies is still loaded with ``weights_only=True``."""


@dataclass(frozen=True)
class FileDigest:
    """Size in bytes and checksum (hex :data:`XXH3`) of a file's content."""

    size: int
    checksum: str


class _HashingWriter:
    """A write-only file object that hashes (XXH3) and counts what passes through it."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._hash = xxhash.xxh3_128()
        self.size = 0

    def write(self, data: bytes) -> int:
        self._hash.update(data)
        self.size += len(data)
        return self._file.write(data)

    def flush(self) -> None:
        self._file.flush()

    def digest(self) -> FileDigest:
        return FileDigest(self.size, self._hash.hexdigest())


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make the directory's entries (a rename, an unlink) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_temp(temp: Path, reused: bool) -> BinaryIO:
    """``temp`` open for writing, never through a symbolic link; a reused file is not truncated,
    which would free its pages (the writer cuts it after the write)."""
    flags = os.O_WRONLY | NOFOLLOW | (0 if reused else os.O_CREAT | os.O_EXCL)
    return os.fdopen(os.open(temp, flags, 0o644), "wb")


def write_atomic(path: str | os.PathLike[str], write: Callable[[BinaryIO], object],
                 reuse: str | os.PathLike[str] | None = None) -> FileDigest:
    """Write ``path`` durably and atomically through ``write(file)``; return the digest of what it wrote.
    ``reuse``, a file of this process's, is written over if it exists, rather than pages allocated anew."""
    path = Path(path)
    temp = temp_path(path)
    try:
        reused = False
        if reuse is not None:
            with contextlib.suppress(FileNotFoundError):
                os.replace(reuse, temp)
                reused = True
        with _open_temp(temp, reused) as file:
            writer = _HashingWriter(file)
            write(writer)  # type: ignore[arg-type]
            file.truncate()
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return writer.digest()


def create_atomic(path: str | os.PathLike[str], data: bytes) -> bool:
    """Create ``path`` holding ``data``, durably and atomically, unless it exists; return whether this call did.

    Of racing creators exactly one wins: a hard link never replaces an existing name.
    """
    path = Path(path)
    temp = temp_path(path, tag=str(threading.get_ident()))
    try:
        with _open_temp(temp, reused=False) as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.link(temp, path)
    except FileExistsError:
        return False
    finally:
        temp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


def create_numbered_dir(parent: str | os.PathLike[str]) -> Path:
    """Create and return ``parent/<n>/``, ``n`` one more than the largest number there.

    Safe against a concurrent caller: each gets a folder of its own.
    """
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    while True:
        taken = [int(p.name) for p in parent.iterdir() if p.name.isdigit()]
        target = parent / str(max(taken, default=0) + 1)
        try:
            target.mkdir()
        except FileExistsError:
            continue
        return target


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, someone else's
    return True


def remove_stale_temps(directory: str | os.PathLike[str]) -> None:
    """Delete the temporary files (or directories) of writers that died mid-write."""
    for name in os.listdir(directory):
        pid = temp_owner_pid(name)
        if pid is not None and not _alive(pid):
            path = Path(directory) / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            logger.info("removed %s, left by writer %d that died mid-write", Path(directory) / name, pid)


def file_digest(path: str | os.PathLike[str]) -> FileDigest:
    """Size and checksum (:data:`XXH3`) of a file on disk."""
    digest = xxhash.xxh3_128()
    size = 0
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return FileDigest(size, digest.hexdigest())
