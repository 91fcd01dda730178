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
its first process, and no process of the job is left.

The same seed draws two **degraded trials** (training through a fault, docs/elastic.md):
the degraded job (tests/support_degraded.py: 1 000 steps of 3 ranks, a ``committed`` line
with the parameters' hash after every step) under ``--min_worker_num`` below 3, one trial
per ``--batch_policy`` (``constant``, ``shrink``), one ``kill -9``ing one rank and the other
two at once (which does which is drawn), at a drawn step, against drawn ranks, with a drawn
``--min_worker_num`` the survivors still meet, and ``--rejoin_cooldown=3``
(:data:`DEGRADED_COOLDOWN`). A change of W forbids bitwise equality, so each must keep
test_degraded.py's invariants: tftrun exits 0, the survivors train alone (a ``shrink`` to
them) in their first processes, the ranks that committed a step agree on its parameters
(the healed ones included), each epoch's samples are a permutation of the data set
(``constant``) or each trained at most once with only the tail left (``shrink``), every rank
ends with the same parameters, and under ``constant`` the final loss is within
``LOSS_TOLERANCE`` of the fault-free run's (``degraded_reference``, the run test_degraded.py
compares against: no fault-free run per trial).

Every trial prints the seed and its own description, and the seed is in every trial's
test id: ``TFT_CHAOS_SEED=<seed> pytest tests/integration/test_chaos.py`` replays the
schedule, ``-k <kind>`` (or ``-k degraded``) one trial of it. Faults are injected at steps
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
    POLICIES,
    SEED_VARIABLE,
    SIGSTOP,
    DegradedTrial,
    Strikes,
    Trial,
    chaos_schedule,
    degraded_schedule,
)
from support_degraded import assert_loss_within_tolerance, assert_trained_through, degraded_job, degraded_steps
from support_mnist import EVENT, JOB_END, START, WORKERS, final_digests, mnist_job

SEED = CHAOS_SEED
STEPS = range(10, 61, 5)
"""Steps a fault may strike at: logged ones (``--log_every 5``), 20 or more before the end."""
TRIALS = chaos_schedule(SEED, WORKERS, STEPS)
HANG_TIMEOUTS = ("--heartbeat_timeout=5", "--progress_timeout=5")
"""Issue 13's case: a SIGSTOPped rank is replaced, and only that rank."""
NOTABLE = ("scheduler_start", "generation", "membership", "verdict", "hang", "exit", "fault",
           "restart", "last_words_claim", "rollback", "recovered", "job_end")
"""The events a failing trial prints, to tell what went wrong at a glance."""
DEGRADED_STEPS = range(20, 301, 10)
"""Steps a degraded trial's kill may strike at (the job logs every committed step): early
enough that the victims heal long before the job's 1 000th step."""
DEGRADED_TRIALS = degraded_schedule(SEED, WORKERS, DEGRADED_STEPS)
DEGRADED_COOLDOWN = 3
"""``--rejoin_cooldown`` of the degraded trials (30 s by default): seconds the survivors
train alone before the victims' relaunches start."""
DEGRADED_END = 240
"""Seconds a degraded trial's job may take to end after its kill (a fault-free one takes
30 to 45 s on 2 busy cores)."""

T = TypeVar("T")

pytestmark = pytest.mark.timeout(START + 2 * EVENT + JOB_END + 30)


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


def test_the_schedule_has_at_least_five_faults_of_every_kind() -> None:
    """Whatever the seed, a run injects every kind of fault, 7 faults in all."""
    assert sorted(t.kind for t in TRIALS) == sorted(FAULTS)
    assert sum(FAULTS[t.kind] for t in TRIALS) >= 5
    assert chaos_schedule(SEED, WORKERS, STEPS) == TRIALS  # one seed, one schedule


def test_the_degraded_trials_kill_one_rank_and_two_under_each_policy() -> None:
    """Whatever the seed, one degraded trial per batch policy, one killing one rank and
    the other two, each leaving at least ``--min_worker_num`` ranks."""
    assert [t.policy for t in DEGRADED_TRIALS] == list(POLICIES)
    assert sorted(len(t.victims) for t in DEGRADED_TRIALS) == [1, 2]
    for trial in DEGRADED_TRIALS:
        assert 1 <= trial.min_workers <= len(trial.survivors(WORKERS))
        assert trial.step in DEGRADED_STEPS
    assert degraded_schedule(SEED, WORKERS, DEGRADED_STEPS) == DEGRADED_TRIALS


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


@pytest.mark.timeout(START + DEGRADED_END + 30)
@pytest.mark.parametrize("trial", DEGRADED_TRIALS, ids=lambda trial: f"seed{SEED}-{trial}")
def test_degraded_chaos_trial(tmp_path: Path, free_port: int, request: pytest.FixtureRequest,
                              trial: DegradedTrial) -> None:
    replay = f"{SEED_VARIABLE}={SEED}, trial {trial}"
    print(f"chaos: {replay}")
    log_dir = tmp_path / "logs"
    command = degraded_job(tmp_path, free_port, f"--batch_policy={trial.policy}",
                           min_workers=trial.min_workers, cooldown=DEGRADED_COOLDOWN)
    with chaos_job(command, log_dir) as proc:
        pids = Job(proc, log_dir).at_step(trial.victims[0], trial.step)
        for rank in trial.victims:
            kill(pids[rank])
        stdout, stderr = proc.communicate(timeout=DEGRADED_END)
    context = f"[{replay}]\nworker spawns (rank, pid): {worker_spawns(log_dir)}\n{stdout}{stderr}"

    assert proc.returncode == 0, context
    shrunk = [e["active"] for e in events(log_dir, "membership") if e["why"] == "shrink"]
    assert trial.survivors(WORKERS) in shrunk, f"the survivors never trained alone {context}"
    assert_struck_only(trial, log_dir, context)
    by_step = assert_trained_through(log_dir, trial.policy)
    assert degraded_steps(by_step), f"no step was trained degraded {context}"
    if trial.policy == "constant":  # the same update as at N: the same loss, to rounding
        assert_loss_within_tolerance(tmp_path / "recovery", request.getfixturevalue("degraded_reference"))
    wait_for(lambda: all(pid_gone(pid) for pid in job_pids(log_dir)), 10,
             f"every process of the job gone [{replay}]")
