"""The only module that starts, signals and reaps child processes.

Every child is started in a session of its own (so a signal to its process group reaches
whatever it started) and with ``PR_SET_PDEATHSIG=SIGKILL``, so that a ``kill -9`` of the
supervisor takes its children with it instead of leaving them running as orphans (which
is what msrun and torchrun do).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

__all__ = ["Child", "Stopping", "open_log", "spawn", "stop_all"]

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl


class Child:
    """A started process: its Popen, and what it was started as."""

    def __init__(self, popen: subprocess.Popen[bytes], started_at: float) -> None:
        self.popen = popen
        self.started_at = started_at

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """Reap the process if it has ended; its returncode, or None while it runs."""
        return self.popen.poll()

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group; a gone group is not an error."""
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            # Already gone (PermissionError: the pid was reaped and reused elsewhere).
            pass


def _die_with(parent_pid: int) -> None:
    """Runs in the child between fork and exec: no allocation, no locks, no logging."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        # The parent died before the prctl took effect: nobody would ever stop us.
        os._exit(1)


def open_log(log_path: Path, header: str) -> BinaryIO:
    """Open ``log_path`` to append, unbuffered, with ``header`` written as a line first."""
    log = open(log_path, "ab", buffering=0)
    log.write(header.encode() + b"\n")
    return log


def spawn(argv: Sequence[str], env: Mapping[str, str], log_path: Path, header: str,
          pass_fds: Iterable[int] = ()) -> Child:
    """Start ``argv`` with stdout and stderr appended to ``log_path``.

    ``header`` is written to the log first, so that the incarnations of one rank are
    told apart in its log. Must be called from the main thread: the parent-death
    signal fires when the *thread* that forked the child ends.
    """
    parent_pid = os.getpid()
    with open_log(log_path, header) as log:
        popen = subprocess.Popen(
            list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
            pass_fds=tuple(pass_fds), preexec_fn=lambda: _die_with(parent_pid),
        )
    return Child(popen, time.time())


class Stopping:
    """Children being stopped the one way, without blocking: ``sig`` to each group now,
    SIGKILL to what is left once ``grace_period`` has passed.

    The caller calls :meth:`poll` until it returns True (every child reaped).
    """

    def __init__(self, children: Iterable[Child], sig: int, grace_period: float) -> None:
        self.children = [c for c in children if c.poll() is None]
        for child in self.children:
            child.signal_group(sig)
        self.deadline = time.monotonic() + grace_period

    def poll(self) -> bool:
        """Reap what ended; SIGKILL the rest past the deadline; True once all ended."""
        pending = [c for c in self.children if c.poll() is None]
        if pending and time.monotonic() >= self.deadline:
            for child in pending:
                child.signal_group(signal.SIGKILL)
        return not pending


def stop_all(children: Iterable[Child], sig: int, grace_period: float) -> None:
    """Stop children and wait until every one is reaped (see :class:`Stopping`)."""
    stopping = Stopping(children, sig, grace_period)
    while not stopping.poll():
        time.sleep(0.01)
