"""tftrun's watchdog: once tftrun is gone, however it went (``kill -9`` included), it kills every process
tftrun started, workers' own children too, which ``PR_SET_PDEATHSIG`` does not reach.

tftrun writes it one line ``SID SINCE`` per session it starts; EOF on that pipe means tftrun is gone.
Processes are known by (pid, start time), so a reused pid is never killed. Standard library only.
"""

from __future__ import annotations

import os
import select
import sys
import time

from launcher.procs.sessions import JobProcesses, Session, every_process, kill_living

SWEEP_FOR = 10.0
"""Seconds to keep killing sessions whose members do not die (stuck in the kernel)."""
SWEEP_INTERVAL = 0.02
LOOK_EVERY = 1.0
"""Seconds between two looks at ``/proc`` while tftrun lives."""


def follow(fd: int, job: JobProcesses) -> None:
    """Read the sessions tftrun reports until EOF, recording the job's processes every LOOK_EVERY seconds."""
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
            next_look = time.monotonic() + LOOK_EVERY


def sweep(job: JobProcesses) -> None:
    """Kill the job's processes until none is left (one may fork while being killed), for at most SWEEP_FOR s."""
    deadline = time.monotonic() + SWEEP_FOR
    while time.monotonic() < deadline:
        living = [p for p in job.look(every_process()) if p.state != "Z"]
        if not living:
            return
        kill_living(living)
        time.sleep(SWEEP_INTERVAL)


def main() -> None:
    job = JobProcesses()
    follow(int(sys.argv[1]), job)
    sweep(job)


if __name__ == "__main__":
    main()
