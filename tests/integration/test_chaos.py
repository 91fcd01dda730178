"""Seeded chaos: random faults against the main job, each run ending as if none happened.

The seed (``TFT_CHAOS_SEED``, else a new one each run; tests/support/chaos.py) draws one
trial of every kind of fault, in an order, each at a step and against ranks of its own:
``kill -9`` of one worker, of two at once, of the scheduler, of a rank while another
one's replacement rejoins, and ``SIGSTOP`` of a rank — 7 faults in 5 runs of the main job
(tests/support/mnist.py: 80 steps of 3 ranks, a checkpoint every 20), with the
lose-nothing modes on or off as drawn, and both hang timeouts tight (5 s), so that a
frozen rank is found, and so that a healthy one wrongly judged hung would show.

Every trial must end as the fault-free run did: tftrun exits 0, every rank's parameters
are bitwise equal to the reference, each survivor (a rank the trial did not strike) kept
its first process, and no process of the job is left.

The same seed draws two degraded trials: tests/integration/test_chaos_degraded.py.

Every trial prints the seed and its own description, and the seed is in every trial's
test id: ``TFT_CHAOS_SEED=<seed> pytest tests/integration/test_chaos.py`` replays the
schedule, ``-k <kind>`` one trial of it. Faults are injected at steps
read from the workers' logs and at moments read from ``events.jsonl``, never after a sleep.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from support import events, pid_gone, spawned_pids, wait_for
from support.chaos import (
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
from support.chaos_jobs import Job, assert_struck_only, chaos_job, job_pids, kill, worker_spawns
from support.mnist import EVENT, JOB_END, START, WORKERS, final_digests, mnist_job

SEED = CHAOS_SEED
STEPS = range(10, 61, 5)
"""Steps a fault may strike at: logged ones (``--log_every 5``), 20 or more before the end."""
TRIALS = chaos_schedule(SEED, WORKERS, STEPS)
HANG_TIMEOUTS = ("--heartbeat_timeout=5", "--progress_timeout=5")
"""Issue 13's case: a SIGSTOPped rank is replaced, and only that rank."""
pytestmark = pytest.mark.timeout(START + 2 * EVENT + JOB_END + 30)


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
    log_dir = tmp_path / "chaos"
    command = mnist_job(tmp_path, "chaos", free_port, *HANG_TIMEOUTS, f"--enable_tft={trial.modes}")
    with chaos_job(command, log_dir) as proc:
        inject(trial, Job(proc, log_dir))
        stdout, stderr = proc.communicate(timeout=JOB_END)
    context = f"[{replay}]\nworker spawns (rank, pid): {worker_spawns(log_dir)}\n{stdout}{stderr}"

    assert proc.returncode == 0, context
    assert final_digests(log_dir) == mnist_reference, context
    assert_struck_only(trial, log_dir, context)
    if trial.kind == KILL_SCHEDULER:
        assert len([e for e in events(log_dir, "spawn") if e["role"] == "scheduler"]) == 2, context
    wait_for(lambda: all(pid_gone(pid) for pid in job_pids(log_dir)), 10,
             f"every process of the job gone [{replay}]")
