"""tftrun's watchdog: once tftrun is gone, however it went, nothing it started is left.

A worker's direct process dies with tftrun (``PR_SET_PDEATHSIG``), but its own children
(a DataLoader's processes, any subprocess) do not: the kernel gives them to init. So
tftrun starts this process first, in a session of its own and without a parent-death
signal, and tells it, one line ``SID SINCE`` per child, the session each child leads.
While tftrun lives, it looks at ``/proc`` every :data:`LOOK_EVERY` seconds and records
the job's processes by identity, (pid, start time), forgetting each session once it is
empty (launcher/procs/sessions.py, ``JobProcesses``). EOF comes when tftrun exits,
``kill -9`` included, since only tftrun holds the pipe's write end. Then it kills the
job's processes, and only them, again until none is left (a process may fork while it is
being killed), for at most :data:`SWEEP_FOR` seconds, and exits. A pid or a session id
reused by another program, after the pid counter wrapped in a long job, is never killed:
its start time is not the one recorded.

Run as ``python -m launcher.procs.watchdog FD``; it imports nothing but the standard library.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from launcher.procs.sessions import JobProcesses, ProcStat, Session, every_process

SWEEP_FOR = 10.0
"""Seconds to keep killing sessions whose members do not die (stuck in the kernel)."""
SWEEP_INTERVAL = 0.02
LOOK_EVERY = 1.0
"""Seconds between two looks at ``/proc`` while tftrun lives."""


def follow(fd: int, job: JobProcesses, look_every: float = LOOK_EVERY) -> None:
    """Read the sessions tftrun reports until it is gone (EOF), looking at the job's
    processes every ``look_every`` seconds meanwhile."""
    pending = b""
    next_look = time.monotonic()
    while True:
        ready, _, _ = select.select([fd], [], [], max(next_look - time.monotonic(), 0.0))
        if ready:
            data = os.read(fd, 65_536)
            if not data:
                return
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                sid, since = line.split()
                job.add(Session(int(sid), int(since)))
        if time.monotonic() >= next_look:
            job.look(every_process())
            next_look = time.monotonic() + look_every


def sweep(job: JobProcesses) -> None:
    """Kill every living process of the job until none is left, or SWEEP_FOR passed."""
    deadline = time.monotonic() + SWEEP_FOR
    while time.monotonic() < deadline:
        living = [p for p in job.look(every_process()) if p.state != "Z"]
        if not living:
            return
        _kill(living)
        time.sleep(SWEEP_INTERVAL)


def _kill(processes: list[ProcStat]) -> None:
    for process in processes:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # it ended meanwhile


def main() -> None:
    job = JobProcesses()
    follow(int(sys.argv[1]), job)
    sweep(job)


if __name__ == "__main__":
    main()
