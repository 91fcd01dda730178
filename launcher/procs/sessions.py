"""The processes of a session, read from ``/proc``: what a child leaves behind when it ends. Killing the
session's members also reaches what moved to another process group, which a signal to the leader's group
misses. Standard library only: the watchdog imports it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ProcStat", "Session", "JobProcesses", "kill_living", "members", "proc_stat", "every_process"]


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


def every_process() -> list[ProcStat]:
    return [stat for name in os.listdir("/proc")
            if name.isdigit() and (stat := proc_stat(int(name))) is not None]


_NEVER = 2**63
"""A start time no process has."""


@dataclass(frozen=True)
class Session:
    """The session a child leads: its id (the leader's pid) and the leader's start time. Only processes
    started no sooner than the leader are members, so a reused session id never reaches a stranger."""

    sid: int
    since: int

    @classmethod
    def led_by(cls, pid: int) -> Session:
        """The session of a child started with ``setsid``, not reaped yet; one that matches no process if
        ``/proc`` does not show the child."""
        stat = proc_stat(pid)
        return cls(pid, stat.starttime if stat is not None else _NEVER)


def members(sessions: Iterable[Session]) -> list[ProcStat]:
    """Every process now in one of ``sessions``, zombies included (one pass over /proc)."""
    since = {s.sid: s.since for s in sessions}  # a reused sid: its newest session
    if not since:
        return []
    return [p for p in every_process() if p.session in since and p.starttime >= since[p.session]]


def kill_living(processes: Iterable[ProcStat]) -> None:
    """SIGKILL each of ``processes`` that is not a zombie already."""
    for process in processes:
        if process.state != "Z":
            try:
                os.kill(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # it ended meanwhile


class JobProcesses:
    """What the watchdog knows to be the job's: each process by (pid, start time), never by a pid or
    session id alone. A session is forgotten once a look finds it empty, so that its id, reused after a pid
    wrap, never reaches a stranger."""

    def __init__(self) -> None:
        self._sessions: dict[int, int] = {}  # sid -> its leader's start time
        self.known: set[tuple[int, int]] = set()
        """(pid, start time) of every process seen to be the job's."""

    def add(self, session: Session) -> None:
        """A child tftrun started, leader of ``session``: the job's from its start."""
        self._sessions[session.sid] = session.since
        self.known.add((session.sid, session.since))

    @property
    def sessions(self) -> list[int]:
        return list(self._sessions)

    def look(self, processes: list[ProcStat]) -> list[ProcStat]:
        """Record and return the job's processes among ``processes`` (one pass over ``/proc``); forget the
        sessions left empty. A child of a job's process is the job's too, which catches one that left its
        session with ``setsid``."""
        by_pid = {p.pid: p for p in processes}
        job: dict[int, ProcStat] = {
            p.pid: p for p in processes
            if (p.pid, p.starttime) in self.known
            or self._sessions.get(p.session, _NEVER) <= p.starttime}
        grew = True
        while grew:
            grew = False
            for p in processes:
                parent = job.get(p.ppid)
                if p.pid not in job and parent is not None and by_pid.get(p.ppid) is parent:
                    job[p.pid] = p
                    grew = True
        self.known = {(p.pid, p.starttime) for p in job.values()}
        occupied = {p.session for p in job.values()}
        self._sessions = {sid: since for sid, since in self._sessions.items() if sid in occupied}
        return list(job.values())
