"""bench/scheduler_scale.py stopped with SIGTERM (a timeout, a user's kill) leaves no
process behind: its simulators are daemons, and a SIGTERM's default action skipped the
clean-up that ends them (seen: four simulators spinning for 15 minutes after their
bench was killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from support import REPO, wait_for

pytestmark = pytest.mark.timeout(120)


def test_a_sigterm_ends_the_bench_and_every_process_it_started() -> None:
    bench = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "scheduler_scale.py"), "--ranks", "16",
         "--mode", "node", "--procs", "2", "--measure", "30", "--json"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started: list[psutil.Process] = []
    try:
        parent = psutil.Process(bench.pid)
        # The scheduler and both simulators, once they run (the window lasts 30 s).
        started = wait_for(lambda: (lambda c: c if len(c) >= 3 else None)(
            parent.children(recursive=True)), 60, "the bench's scheduler and simulators")
        bench.send_signal(signal.SIGTERM)
        bench.wait(60)
        gone, alive = psutil.wait_procs(started, timeout=10)
        assert not alive, f"left running: {[(p.pid, p.cmdline()[:3]) for p in alive]}"
    finally:
        for process in [*started, psutil.Process(bench.pid)] if bench.poll() is None else started:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        bench.wait(10)
