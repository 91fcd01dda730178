"""The scheduler's open files, in a process of their own: it raises its limit to the hard
one, and serves with more than 1 024 descriptors open."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from support import events

pytestmark = pytest.mark.timeout(60)


def test_the_scheduler_raises_its_open_files_limit_for_a_connection_per_node_and_news() -> None:
    """Two store connections per node (beats, news watch): a soft limit of 1 024 would
    refuse nodes past 500; the scheduler takes its hard limit."""
    code = ("import resource; from recovery.control.process_limits import raise_open_files_limit; "
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard)); "
            "raise_open_files_limit(); print(resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.strip() == "True"


def test_the_scheduler_serves_with_more_than_1024_files_open(tmp_path: Path, free_port: int) -> None:
    """Nodes connect as soon as the store listens: a scheduler (relaunched, or slow to
    start) may hold more than 1 024 connections before it makes the pipe its main thread
    waits on, and a wait that cannot take a descriptor past 1 024 (``select``) ended it
    with ``ValueError: filedescriptor out of range`` (seen at 8192 simulated ranks)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"a hard limit of {hard} open files")
    here = Path(__file__).resolve().parent
    code = f"""
import os, sys, threading
sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]
from pathlib import Path
from support.sched_inprocess import scheduler_config
from support import wait_for_event
from recovery.control.process_limits import raise_open_files_limit
from recovery.control.scheduler import Scheduler
raise_open_files_limit()
scheduler = Scheduler(scheduler_config(Path({str(tmp_path)!r}), {free_port}))
held = [os.open(os.devnull, os.O_RDONLY)]
while held[-1] < 1100:  # every descriptor up to past select's 1 024 taken
    held.append(os.open(os.devnull, os.O_RDONLY))
result = []
thread = threading.Thread(target=lambda: result.append(scheduler.run()), daemon=True)
thread.start()
wait_for_event(Path({str(tmp_path)!r}) / "logs", 30, "serving", event="scheduler_start")
scheduler.request_stop("the test is over")
thread.join(20)
print("exit", result)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert done.stdout.strip() == "exit [0]", done.stderr[:2000]
    assert events(tmp_path / "logs", "scheduler_stop")[0]["reason"] == "the test is over"
