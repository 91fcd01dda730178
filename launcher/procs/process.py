"""The only module that starts, signals and reaps child processes.

Each child leads its own session and dies with tftrun (``PR_SET_PDEATHSIG``), and the :class:`Watchdog` kills
what is left after a ``kill -9``, so that no process outlives its place in the job (docs/cli.md#no-stray-processes).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from launcher.procs.sessions import Session, kill_living, members
from launcher.procs.spec import OWN_PYTHON, own_env
from recovery.safe_files import open_append

__all__ = ["Adopted", "Child", "Stopping", "Watchdog", "become_subreaper", "open_log", "spawn", "stop_all",
           "sweep"]

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
SWEEP_WAIT = 0.5
"""Seconds a child's reaping waits for what it left in its session, killed, to die."""
WATCHDOG_CLOSE_WAIT = 5.0
"""Seconds tftrun waits, as it exits, for the watchdog's last sweep."""

_ended_sessions: list[Session] = []
"""Sessions whose leader was reaped and that may still hold processes (see :func:`sweep`)."""


def become_subreaper() -> None:
    """Make this process a child subreaper, so that what its descendants orphan stays within reach to be
    killed and reaped."""
    if _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def sweep() -> None:
    """Kill and reap what ended children left in their sessions; forget each session once it is empty."""
    if not _ended_sessions:
        return
    found = members(_ended_sessions)
    kill_living(found)
    me = os.getpid()
    for member in found:
        if member.state == "Z" and member.ppid == me:
            try:
                os.waitpid(member.pid, os.WNOHANG)
            except ChildProcessError:
                pass  # reaped meanwhile
    occupied = {member.session for member in found}
    _ended_sessions[:] = [s for s in _ended_sessions if s.sid in occupied]


def _await_dead(session: Session, timeout: float) -> None:
    """Wait up to ``timeout`` seconds until the killed members of ``session`` are dead: a warm relaunch
    starts at once, and its predecessor's processes must be gone by then, not only signalled."""
    deadline = time.monotonic() + timeout
    while any(m.state != "Z" for m in members([session])) and time.monotonic() < deadline:
        time.sleep(0.002)


class Adopted:
    """A process re-parented to this subreaper (a fork server's worker), reaped with ``waitpid``;
    ``returncode`` as ``Popen`` gives it (-N for a death by signal N)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                # Not this process's child (any more): reaped elsewhere, its status lost.
                logger.warning("pid %d was reaped elsewhere: its exit status is unknown",
                               self.pid)
                self.returncode = -signal.SIGKILL
            else:
                if pid != 0:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class Child:
    """A started process: its Popen (or :class:`Adopted`), and what it was started as."""

    def __init__(self, process: subprocess.Popen[bytes] | Adopted) -> None:
        self.process = process
        self.session = Session.led_by(process.pid)
        # Its pid is free again, so a session of that id that ended is empty now: forget
        # it, lest the sweep take this child for one of its members.
        _ended_sessions[:] = [s for s in _ended_sessions if s.sid != self.session.sid]

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        """Reap the process if it has ended; its returncode, or None while it runs. Once ended, what it left
        in its session is killed at once, so none outlives it into its relaunch."""
        if self.process.returncode is not None:
            return self.process.returncode
        returncode = self.process.poll()
        if returncode is not None:
            _ended_sessions.append(self.session)
            sweep()
            if self.session in _ended_sessions:  # it left processes, killed just now
                _await_dead(self.session, SWEEP_WAIT)
                sweep()
        return returncode

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group; a gone group is not an error."""
        try:
            os.killpg(self.process.pid, sig)
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
    log = os.fdopen(open_append(log_path), "ab", buffering=0)
    log.write(header.encode() + b"\n")
    return log


def spawn(argv: Sequence[str], env: Mapping[str, str], log_path: Path, header: str,
          pass_fds: Iterable[int] = ()) -> Child:
    """Start ``argv`` with stdout and stderr appended to ``log_path``, after the line ``header``.

    Call it from the main thread: the parent-death signal fires when the *thread* that forked the child ends.
    """
    parent_pid = os.getpid()
    with open_log(log_path, header) as log:
        popen = subprocess.Popen(
            list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
            pass_fds=tuple(pass_fds), preexec_fn=lambda: _die_with(parent_pid),
        )
    return Child(popen)


class Stopping:
    """Children being stopped without blocking: ``sig`` to each group now, SIGKILL to what is left after
    ``grace_period``; call :meth:`poll` until it returns True."""

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


class Watchdog:
    """The started launcher/procs/watchdog.py: it kills each session it was told of once this process is gone."""

    def __init__(self) -> None:
        read_fd, self._write_fd = os.pipe()
        try:
            self._popen = subprocess.Popen(
                [*OWN_PYTHON, "-m", "launcher.procs.watchdog", str(read_fd)], env=own_env(os.environ),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True, pass_fds=(read_fd,))
        except BaseException:
            os.close(self._write_fd)
            raise
        finally:
            os.close(read_fd)
        self._lost = False

    def watch(self, child: Child) -> None:
        """Have ``child``'s session killed once this process is gone."""
        try:
            os.write(self._write_fd, f"{child.session.sid} {child.session.since}\n".encode())
        except BrokenPipeError:
            if not self._lost:
                logger.warning("the watchdog (pid %d) is gone: after a kill -9 of tftrun, "
                               "what its workers started may outlive them", self._popen.pid)
            self._lost = True

    def close(self) -> None:
        """Let the watchdog make its last sweep and exit; wait for it (bounded)."""
        os.close(self._write_fd)
        try:
            self._popen.wait(WATCHDOG_CLOSE_WAIT)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()
