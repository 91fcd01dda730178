"""Seeded chaos: random faults against the main job, each run ending as if none happened.

The seed (``TFT_CHAOS_SEED``, else a new one each run; tests/support_chaos.py) draws one
trial of every kind of fault, in an order, each at a step and against ranks of its own:
``kill -9`` of one worker, of two at once, of the scheduler, of a rank while another
one's replacement rejoins, and ``SIGSTOP`` of a rank — 7 faults in 5 runs of the main job
(tests/support_mnist.py: 80 steps of 3 ranks, a checkpoint every 20), with the
lose-nothing modes on or off as drawn, and both hang timeouts tight (5 s), so that a
frozen rank is found, and so that a healthy one wrongly judged hung would show.

Every trial must end as the fault-free run did: tftrun exits 0, every rank's parameters
are bitwise equal to the reference, each survivor (a rank the trial did not strike) kept
its first process, and no process of the job is left. Every trial prints the seed and
its own description, and the seed is in every trial's test id:
``TFT_CHAOS_SEED=<seed> pytest tests/integration/test_chaos.py`` replays the schedule,
``-k <kind>`` one trial of it. Faults are injected at steps
read from the workers' logs and at moments read from ``events.jsonl``, never after a sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from support import events, log_has, pid_gone, spawn, spawned_pids, terminate, wait_for
from support_chaos import (
    CHAOS_SEED,
    FAULTS,
    KILL_ONE,
    KILL_SCHEDULER,
    KILL_TWO,
    KILL_WHILE_REJOINING,
    SEED_VARIABLE,
    SIGSTOP,
    Trial,
    chaos_schedule,
)
from support_mnist import EVENT, JOB_END, START, WORKERS, final_digests, mnist_job

SEED = CHAOS_SEED
STEPS = range(10, 61, 5)
"""Steps a fault may strike at: logged ones (``--log_every 5``), 20 or more before the end."""
TRIALS = chaos_schedule(SEED, WORKERS, STEPS)
HANG_TIMEOUTS = ("--heartbeat_timeout=5", "--progress_timeout=5")
"""Issue 13's case: a SIGSTOPped rank is replaced, and only that rank."""
NOTABLE = ("scheduler_start", "generation", "verdict", "hang", "exit", "fault", "restart",
           "last_words_claim", "rollback", "recovered", "job_end")
"""The events a failing trial prints, to tell what went wrong at a glance."""

T = TypeVar("T")

pytestmark = pytest.mark.timeout(START + 2 * EVENT + JOB_END + 30)


@contextmanager
def chaos_job(tmp_path: Path, port: int, trial: Trial) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """The main job under tftrun, in the background; stopped whatever the trial does."""
    log_dir = tmp_path / "chaos"
    proc = spawn(mnist_job(tmp_path, "chaos", port, *HANG_TIMEOUTS, f"--enable_tft={trial.modes}"))
    try:
        yield proc, log_dir
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


def inject(trial: Trial, job: Job) -> None:
    """Strike as ``trial`` says, each fault once the one before it has shown its effect."""
    victims = trial.victims
    pids = job.at_step(victims[0] if victims else 0, trial.step)
    if trial.kind in (KILL_ONE, KILL_TWO):
        for rank in victims:
            kill(pids[rank])
    elif trial.kind == KILL_SCHEDULER:
        kill(spawned_pids(job.log_dir, "scheduler")[None])
        job.event("the scheduler reloaded", event="scheduler_start", reloaded=True)
    elif trial.kind == KILL_WHILE_REJOINING:
        rejoining, other = victims
        kill(pids[rejoining])
        replacement = job.relaunched(rejoining, pids[rejoining])
        if trial.moment == "register":
            job.event(f"rank {rejoining}'s replacement registered", event="register",
                      pid=replacement)
        kill(pids[other])
    elif trial.kind == SIGSTOP:
        [rank] = victims
        os.kill(pids[rank], signal.SIGSTOP)
        job.event(f"rank {rank} declared hung", event="hang", rank=rank, pid=pids[rank])
    else:
        raise AssertionError(f"unknown fault kind {trial.kind!r}")


def job_pids(log_dir: Path) -> set[int]:
    """Every process tftrun started (workers, scheduler, spares), and tftrun itself."""
    started = {e["pid"] for e in events(log_dir, "spawn")}
    return started | {e["pid"] for e in events(log_dir, "job_start")}


def test_the_schedule_has_at_least_five_faults_of_every_kind() -> None:
    """Whatever the seed, a run injects every kind of fault, 7 faults in all."""
    assert sorted(t.kind for t in TRIALS) == sorted(FAULTS)
    assert sum(FAULTS[t.kind] for t in TRIALS) >= 5
    assert chaos_schedule(SEED, WORKERS, STEPS) == TRIALS  # one seed, one schedule


@pytest.mark.parametrize("trial", TRIALS, ids=lambda trial: f"seed{SEED}-{trial}")
def test_chaos_trial(tmp_path: Path, free_port: int, mnist_reference: dict[int, str],
                     trial: Trial) -> None:
    replay = f"{SEED_VARIABLE}={SEED}, trial {trial}"
    print(f"chaos: {replay}")
    with chaos_job(tmp_path, free_port, trial) as (proc, log_dir):
        inject(trial, Job(proc, log_dir))
        stdout, stderr = proc.communicate(timeout=JOB_END)
    workers = [(e["rank"], e["pid"]) for e in events(log_dir, "spawn") if e["role"] == "worker"]
    context = f"[{replay}]\nworker spawns (rank, pid): {workers}\n{stdout}{stderr}"

    assert proc.returncode == 0, context
    assert final_digests(log_dir) == mnist_reference, context
    for rank in trial.survivors(WORKERS):
        assert len([pid for r, pid in workers if r == rank]) == 1, \
            f"survivor rank {rank} lost its process {context}"
    for rank in trial.victims:
        assert len([pid for r, pid in workers if r == rank]) >= 2, \
            f"rank {rank} was struck but never relaunched {context}"
    if trial.kind == KILL_SCHEDULER:
        assert len([e for e in events(log_dir, "spawn") if e["role"] == "scheduler"]) == 2, context
    wait_for(lambda: all(pid_gone(pid) for pid in job_pids(log_dir)), 10,
             f"every process of the job gone [{replay}]")
