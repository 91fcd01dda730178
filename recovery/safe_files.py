"""Folders and files that another user cannot turn against the job's: one who may write into
``--log_dir`` or ``--recovery_path`` could plant ``worker_0.log -> ~/.bashrc`` there, so such
folders must be the user's own and files are opened with ``O_NOFOLLOW``. Standard library
only: the fork server imports it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["resolved_folder", "own_subfolder", "UnsafeFolder", "open_append", "NOFOLLOW"]

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class UnsafeFolder(ValueError):
    """A folder the job must not write into; the message says why, in one line."""


def resolved_folder(path: Path) -> Path:
    """The existing folder ``path``, resolved and checked component by component: use it from
    then on, so that a link on the way changed later is never followed. Raises
    :class:`UnsafeFolder` for a folder another user owns, may write into, or could replace
    (sticky ``/tmp`` is fine)."""
    try:
        real = Path(os.path.realpath(path, strict=True))
    except OSError as err:
        raise UnsafeFolder(err.strerror or str(err)) from None
    for folder in (*reversed(real.parents), real):
        try:
            info = os.lstat(folder)
        except OSError as err:
            raise UnsafeFolder(f"{folder}: {err.strerror}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise UnsafeFolder(f"{folder} is no longer a folder: it was replaced as it was checked")
        if folder == real:
            _check_own(info)
        else:
            _check_on_the_way(folder, info)
    return real


def own_subfolder(path: Path) -> Path:
    """The folder ``path`` inside a checked folder, made if missing, and refused as
    :func:`resolved_folder` refuses one (a symbolic link in its place included)."""
    try:
        path.mkdir(mode=0o755, exist_ok=True)
        info = os.lstat(path)
    except OSError as err:
        raise UnsafeFolder(f"{path}: {err.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolder(f"{path} is not a folder (a symbolic link is refused)")
    _check_own(info)
    return path


def _check_own(info: os.stat_result) -> None:
    if info.st_uid != os.getuid():
        raise UnsafeFolder(f"it is owned by another user (uid {info.st_uid})")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeFolder(f"others may write into it (mode {stat.S_IMODE(info.st_mode):o}): "
                           "chmod go-w it, or choose another")


def _check_on_the_way(folder: Path, info: os.stat_result) -> None:
    if info.st_uid not in (0, os.getuid()):
        raise UnsafeFolder(f"it lies in {folder}, owned by another user (uid {info.st_uid}), "
                           "who could replace it: choose another")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise UnsafeFolder(f"it lies in {folder}, which others may write into (mode "
                           f"{stat.S_IMODE(info.st_mode):o}) and so replace it: choose another")


def open_append(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """A descriptor of ``path`` opened to append (created if missing), never through a
    symbolic link (OSError ELOOP)."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW | os.O_CLOEXEC,
                   mode)
