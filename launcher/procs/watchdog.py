"""tftrun's watchdog: once tftrun is gone, however it went, nothing it started is left.

A worker's direct process dies with tftrun (``PR_SET_PDEATHSIG``), but its own children
(a DataLoader's processes, any subprocess) do not: the kernel gives them to init. So
tftrun starts this process first, in a session of its own and without a parent-death
signal, and tells it, one line ``SID SINCE`` per child, the session each child leads.
It reads until EOF, which comes when tftrun exits, ``kill -9`` included, since only
tftrun holds the pipe's write end. Then it kills every process still in one of those
sessions, again until none is left (a process may fork while it is being killed), for at
most :data:`SWEEP_FOR` seconds, and exits.

Run as ``python -m launcher.procs.watchdog FD``; it imports nothing but the standard library.
"""

from __future__ import annotations

import os
import sys
import time

from launcher.procs.sessions import Session, kill_members

SWEEP_FOR = 10.0
"""Seconds to keep killing sessions whose members do not die (stuck in the kernel)."""
SWEEP_INTERVAL = 0.02


def read_sessions(fd: int) -> list[Session]:
    """The sessions tftrun reported, once it is gone (EOF)."""
    sessions = []
    with os.fdopen(fd, "rb") as pipe:
        for line in pipe:
            sid, since = line.split()
            sessions.append(Session(int(sid), int(since)))
    return sessions


def sweep(sessions: list[Session]) -> None:
    """Kill every living member of ``sessions`` until none is left, or SWEEP_FOR passed."""
    deadline = time.monotonic() + SWEEP_FOR
    while time.monotonic() < deadline:
        living = [m for m in kill_members(sessions) if m.state != "Z"]
        if not living:
            return
        time.sleep(SWEEP_INTERVAL)


def main() -> None:
    sweep(read_sessions(int(sys.argv[1])))


if __name__ == "__main__":
    main()
