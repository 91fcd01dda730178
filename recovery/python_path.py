"""``PYTHONPATH`` for tftrun's own processes, and the ``sys.path`` a worker gets. An empty or
relative ``PYTHONPATH`` entry names the working folder even under ``-P``, where a planted
``recovery/`` would be imported: tftrun's own processes get only the absolute entries.
Standard library only: the fork server imports it."""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["PYTHONPATH", "own_pythonpath", "interpreter_sys_path", "worker_sys_path"]

PYTHONPATH = "PYTHONPATH"


def own_pythonpath(value: str) -> str:
    """``value`` (a ``PYTHONPATH``) without its empty and relative entries."""
    return os.pathsep.join(entry for entry in value.split(os.pathsep) if os.path.isabs(entry))


def _entries(value: str) -> list[str]:
    """What Python puts on ``sys.path`` for ``PYTHONPATH=value``, in the working folder."""
    return [os.path.abspath(entry) for entry in value.split(os.pathsep)] if value else []


def interpreter_sys_path(sys_path: Sequence[str], pythonpath: str) -> list[str]:
    """``sys_path`` of a Python started with ``-P`` and ``PYTHONPATH=pythonpath``, without
    what ``pythonpath`` put there: the interpreter's own entries."""
    given = set(_entries(pythonpath))
    return [entry for entry in sys_path if entry not in given]


def worker_sys_path(first: str, pythonpath: str, interpreter: Sequence[str]) -> list[str]:
    """The ``sys.path`` of a fresh ``python`` whose first entry is ``first`` (the script's
    folder, or for ``-m`` the working folder), started with ``PYTHONPATH=pythonpath``;
    ``interpreter``: :func:`interpreter_sys_path`'s entries."""
    return list(dict.fromkeys([first, *_entries(pythonpath), *interpreter]))
