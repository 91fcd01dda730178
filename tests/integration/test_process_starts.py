"""support.process_starts, the unit tests' check that they start no process: it sees a
fork and a subprocess, and leaves os and subprocess as they were."""

from __future__ import annotations

import os
import subprocess
import sys

from support.process_starts import process_starts


def test_a_fork_and_a_subprocess_are_seen_and_the_calls_restored_after() -> None:
    fork, fork_exec = os.fork, subprocess._fork_exec  # type: ignore[attr-defined]
    with process_starts() as started:
        assert subprocess.run([sys.executable, "-c", "pass"], timeout=60).returncode == 0
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
    assert started == ["subprocess._fork_exec", "os.fork"]
    assert (os.fork, subprocess._fork_exec) == (fork, fork_exec)  # type: ignore[attr-defined]


def test_nothing_is_seen_where_no_process_starts() -> None:
    with process_starts() as started:
        assert os.getpid() > 0
    assert started == []
