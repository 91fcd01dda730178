"""The processes of a session, read from ``/proc``: what a child leaves behind when it ends.

Every child tftrun starts leads a session of its own (``setsid``), and whatever it starts
stays in that session unless it calls ``setsid`` itself: a DataLoader's worker processes,
a ``sleep``, a shell pipeline in a process group of its own. Killing a session's members
reaches all of them, where a signal to the leader's process group misses the last kind.

Standard library only: the watchdog (launcher/procs/watchdog.py) imports it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ProcStat", "Session", "kill_members", "members", "proc_stat"]


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that tell whose a process is."""

    pid: int
    state: str
    """``Z`` for a zombie: it ended and waits for its parent to reap it."""
    ppid: int
    session: int
    starttime: int
    """When it started, in clock ticks after boot."""


def proc_stat(pid: int) -> ProcStat | None:
    """``pid``'s stat, or ``None`` when no such process is left."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses.
    fields = text[text.rindex(")") + 2:].split()
    return ProcStat(pid, fields[0], int(fields[1]), int(fields[3]), int(fields[19]))


def _every_process() -> list[ProcStat]:
    stats = []
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := proc_stat(int(name))) is not None:
            stats.append(stat)
    return stats


_NEVER = 2**63
"""A start time no process has."""


@dataclass(frozen=True)
class Session:
    """The session that a child leads: its id (the leader's pid) and the leader's start.

    A process counts as a member only if it started no sooner than the leader, so that a
    session id reused after the whole session ended never reaches a stranger.
    """

    sid: int
    since: int

    @classmethod
    def led_by(cls, pid: int) -> Session:
        """The session of a child started with ``setsid`` and not reaped yet (one that
        matches no process if ``/proc`` does not show the child)."""
        stat = proc_stat(pid)
        return cls(pid, stat.starttime if stat is not None else _NEVER)


def members(sessions: Iterable[Session]) -> list[ProcStat]:
    """Every process now in one of ``sessions``, zombies included (one pass over /proc)."""
    since = {s.sid: s.since for s in sessions}  # a reused sid: its newest session
    if not since:
        return []
    return [p for p in _every_process() if p.session in since and p.starttime >= since[p.session]]


def kill_members(sessions: Iterable[Session]) -> list[ProcStat]:
    """SIGKILL every living member of ``sessions``; returns the members found."""
    found = members(sessions)
    for member in found:
        if member.state != "Z":
            try:
                os.kill(member.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # it ended meanwhile
    return found
