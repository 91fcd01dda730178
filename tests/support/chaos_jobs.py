"""Running a chaos trial's job (tests/integration/test_chaos.py, test_chaos_degraded.py):
the job in the background, waits that fail at once if it ends, the strikes, and what a
failing trial prints."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from support import events, log_has, spawn, spawned_pids, terminate, wait_for
from support.chaos import Strikes
from support.mnist import EVENT, START, WORKERS

T = TypeVar("T")

NOTABLE = ("scheduler_start", "generation", "membership", "verdict", "hang", "exit", "fault",
           "restart", "last_words_claim", "rollback", "recovered", "job_end")
"""The events a failing trial prints, to tell what went wrong at a glance."""


@contextmanager
def chaos_job(command: list[str], log_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """A job under tftrun (``command``, logs in ``log_dir``), in the background; stopped
    whatever the trial does."""
    proc = spawn(command)
    try:
        yield proc
    finally:
        terminate(proc)
        print(timeline(log_dir))


def timeline(log_dir: Path) -> str:
    """The job's notable events, one a line, timed from its start (shown when a trial fails)."""
    found = events(log_dir)
    start = found[0]["ts"] if found else 0.0
    skip = ("ts", "event", "members", "run_id", "host", "node_id", "path", "why")
    return "\n".join(
        f"{e['ts'] - start:7.2f} {e['event']} "
        + " ".join(f"{k}={v}" for k, v in e.items() if k not in skip)
        for e in found if e["event"] in NOTABLE)


class Job:
    """Waits on a running trial's job that fail at once, with the reason, if it ends."""

    def __init__(self, proc: subprocess.Popen[str], log_dir: Path) -> None:
        self.proc, self.log_dir = proc, log_dir

    def wait(self, predicate: Callable[[], T], timeout: float, what: str) -> T:
        def check() -> T:
            found = predicate()
            if not found and self.proc.poll() is not None:
                pytest.fail(f"the job ended (exit {self.proc.returncode}) while waiting for {what}")
            return found
        return wait_for(check, timeout, what)

    def at_step(self, rank: int, step: int) -> dict[int | None, int]:
        """Wait until ``rank`` logs ``step``; return each rank's pid then."""
        self.wait(lambda: log_has(self.log_dir, rank, f"step={step} "), START,
                  f"rank {rank} at step {step}")
        return spawned_pids(self.log_dir)

    def event(self, what: str, **match: Any) -> dict[str, Any]:
        """Wait for an event whose fields equal ``match``."""
        def find() -> dict[str, Any] | None:
            return next((e for e in events(self.log_dir)
                         if all(e.get(k) == v for k, v in match.items())), None)
        return self.wait(find, EVENT, what)

    def relaunched(self, rank: int, pid: int) -> int:
        """Wait until ``rank`` runs in a process other than ``pid``; return its pid."""
        return self.wait(lambda: spawned_pids(self.log_dir)[rank] != pid
                         and spawned_pids(self.log_dir)[rank], EVENT, f"rank {rank} relaunched")


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def job_pids(log_dir: Path) -> set[int]:
    """Every process tftrun started (workers, scheduler, spares), and tftrun itself."""
    started = {e["pid"] for e in events(log_dir, "spawn")}
    return started | {e["pid"] for e in events(log_dir, "job_start")}


def worker_spawns(log_dir: Path) -> list[tuple[int, int]]:
    """(rank, pid) of every worker process the job started, in order."""
    return [(e["rank"], e["pid"]) for e in events(log_dir, "spawn") if e["role"] == "worker"]


def assert_struck_only(trial: Strikes, log_dir: Path, context: str) -> None:
    """Each rank the trial did not strike kept its first process; each it struck was
    started again."""
    workers = worker_spawns(log_dir)
    for rank in trial.survivors(WORKERS):
        assert len([pid for r, pid in workers if r == rank]) == 1, \
            f"survivor rank {rank} lost its process {context}"
    for rank in trial.victims:
        assert len([pid for r, pid in workers if r == rank]) >= 2, \
            f"rank {rank} was struck but never relaunched {context}"
