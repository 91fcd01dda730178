"""``PYTHONPATH`` for tftrun's own processes, and the ``sys.path`` a worker gets.

An empty or relative entry of ``PYTHONPATH`` (``PYTHONPATH=:/x``, which ``$PYTHONPATH:/x``
makes when it was unset) is taken against the working folder, and Python makes it absolute
before any code runs; ``-P`` does not drop it. A ``recovery/`` planted in the working folder
would then be imported by tftrun's own processes. So they are started with ``-P`` and the
absolute entries of ``PYTHONPATH`` only (:func:`own_pythonpath`), while a worker forked
from one of them gets the ``sys.path`` a fresh ``python script.py`` would have
(:func:`worker_sys_path`), as under torchrun.

Standard library only: the fork server (launcher/procs/fork_server_main.py) imports it.
"""

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
    what ``pythonpath`` put there: the interpreter's own entries (its standard library,
    its site-packages)."""
    given = set(_entries(pythonpath))
    return [entry for entry in sys_path if entry not in given]


def worker_sys_path(first: str, pythonpath: str, interpreter: Sequence[str]) -> list[str]:
    """The ``sys.path`` of a fresh ``python`` whose first entry is ``first`` (the script's
    folder, or for ``-m`` the working folder), started with ``PYTHONPATH=pythonpath`` in
    the working folder; ``interpreter``: :func:`interpreter_sys_path`'s entries. Each
    entry once, at its first place, as Python's ``site`` leaves them."""
    return list(dict.fromkeys([first, *_entries(pythonpath), *interpreter]))
