"""An injected fault delivered in a real process (it kills, stops or hangs that process),
and ``tftctl inject``'s choice of a pid to signal, checked against a live process."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from launcher.cli.inject import _signal_target
from recovery import env as names
from support import REPO


def run_delivered(fault: str) -> subprocess.Popen[str]:
    code = ("import logging; logging.basicConfig(); from recovery.control.inject import *; "
            f"deliver(Injection('x', 0, {fault!r}, None)); print('returned', flush=True)")
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize(("fault", "returncode"), [("kill", -9), ("term", -15)])
def test_kill_and_term_signal_the_process_itself(fault: str, returncode: int) -> None:
    proc = run_delivered(fault)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == returncode and "returned" not in out


def test_hang_keeps_the_process_alive_without_returning() -> None:
    proc = run_delivered("hang")
    try:
        line = proc.stderr.readline() if proc.stderr else ""  # logged before it blocks
        assert "injected hang (injection x) at the next step" in line
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    assert proc.returncode == -9


def test_tftctl_signals_a_pid_only_when_it_is_a_live_process_of_this_job() -> None:
    job = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); "
                            "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True, env={**os.environ, names.TFT_RUN_ID: "r-x"})
    try:
        assert job.stdout is not None and job.stdout.readline() == "up\n"  # past its exec
        def status(pid: int, state: str = "alive") -> dict[str, Any]:
            return {"run_id": "r-x", "members": [{"rank": 1, "pid": pid, "state": state}]}

        assert _signal_target(status(job.pid), 1) == job.pid
        assert _signal_target(status(job.pid), 0) is None  # no member holds rank 0
        assert _signal_target(status(job.pid, "dead"), 1) is None
        assert _signal_target(status(os.getpid()), 1) is None  # not this job's process
    finally:
        job.communicate(timeout=10)
