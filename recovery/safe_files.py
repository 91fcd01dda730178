"""Folders and files that another user cannot turn against the job's.

tftrun writes into folders a user names (``--log_dir``, ``--recovery_path``), which may
lie in a shared place. Another user who owns such a folder, or may write into it, could
plant ``worker_0.log -> ~/.bashrc`` there and have the job overwrite the user's file. So:

* a folder the job writes into must be the user's own and writable by nobody else
  (:func:`folder_problem`); tftrun refuses any other, one line, exit 2;
* its files are opened with ``O_NOFOLLOW`` (:func:`open_append`): a symbolic link planted
  in place of a log is refused, never followed;
* temporary files get unpredictable names and are created exclusively
  (recovery/ckpt/durable.py).

Standard library only: the spare (launcher/procs/spare.py) imports it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["folder_problem", "open_append", "NOFOLLOW"]

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def folder_problem(path: Path) -> str | None:
    """Why the job must not write into the existing folder ``path``, or ``None``.

    Refused: a folder owned by another user (root's excepted when running as root), one
    that others may write into (group- or world-writable), and a symbolic link to one.
    """
    try:
        info = path.stat()
    except OSError as err:
        return err.strerror or str(err)
    if info.st_uid != os.getuid():
        return f"it is owned by another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"others may write into it (mode {stat.S_IMODE(info.st_mode):o}): "
                "chmod go-w it, or choose another")
    return None


def open_append(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """A descriptor of ``path`` opened to append (created if missing), never through a
    symbolic link (OSError ELOOP)."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW | os.O_CLOEXEC,
                   mode)
