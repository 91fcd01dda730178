"""The watchdog kills processes by identity (issue 26): a real process leading a session
whose id the job's session had is left alone."""

from __future__ import annotations

import os
import subprocess
import sys

from launcher.procs.sessions import JobProcesses, Session, proc_stat


def test_the_old_rule_would_kill_a_real_process_in_a_reused_session() -> None:
    """A real process leading its own session stands for the program that got the id:
    following the job's session until it emptied, the watchdog leaves it alone."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    try:
        seen = proc_stat(other.pid)
        assert seen is not None
        job = JobProcesses()
        job.add(Session(other.pid, seen.starttime - 10))  # the job's, long before
        job.look([])  # a look while that session was empty
        assert job.look([seen]) == []
        os.kill(other.pid, 0)  # alive
    finally:
        other.kill()
        other.wait()
