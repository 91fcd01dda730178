"""Seeded chaos, degraded: the chaos test's seed (tests/support/chaos.py) also draws two
trials of training through a fault (docs/elastic.md), apart from tests/integration/
test_chaos.py so that the two files run side by side.

The degraded job (tests/support/degraded.py: 375 steps of 3 ranks, paced while degraded, a ``committed`` line
with the parameters' hash after every step) under ``--min_worker_num`` below 3, one trial
per ``--batch_policy`` (``constant``, ``shrink``), one ``kill -9``ing one rank and the other
two at once (which does which is drawn), at a drawn step, against drawn ranks, with a drawn
``--min_worker_num`` the survivors still meet, and ``--rejoin_cooldown=3``
(:data:`DEGRADED_COOLDOWN`). A change of W forbids bitwise equality, so each must keep
test_degraded.py's invariants: tftrun exits 0, the survivors train alone (a ``shrink`` to
them) in their first processes, the ranks that committed a step agree on its parameters
(the healed ones included), each epoch's samples are a permutation of the data set
(``constant``) or each trained at most once with only the tail left (``shrink``), every rank
ends with the same parameters; under ``constant`` the final loss is within
``LOSS_TOLERANCE`` of the fault-free run's (``degraded_reference``, the run test_degraded.py
compares against: no fault-free run per trial); under ``shrink`` the steps are more and
smaller, and the step events' ``total`` and ``batch`` say so (``assert_shrink_seen``).

Every trial prints the seed and its own description, and the seed is in its test id:
``TFT_CHAOS_SEED=<seed> pytest tests/integration/test_chaos_degraded.py`` replays them.
The kills strike at steps read from the workers' logs, never after a sleep.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support import events, pid_gone, wait_for
from support.chaos import CHAOS_SEED, POLICIES, SEED_VARIABLE, DegradedTrial, degraded_schedule
from support.chaos_jobs import Job, assert_struck_only, chaos_job, job_pids, kill, worker_spawns
from support.degraded import (
    assert_loss_within_tolerance,
    assert_shrink_seen,
    assert_trained_through,
    degraded_job,
    degraded_steps,
)
from support.mnist import START, WORKERS

SEED = CHAOS_SEED
DEGRADED_STEPS = range(20, 151, 10)
"""Steps a degraded trial's kill may strike at (the job logs every committed step): early
enough that the victims heal long before the job's 500th step (its
survivors' steps are paced)."""
DEGRADED_TRIALS = degraded_schedule(SEED, WORKERS, DEGRADED_STEPS)
DEGRADED_COOLDOWN = 3
"""``--rejoin_cooldown`` of the degraded trials (30 s by default): seconds the survivors
train alone before the victims' relaunches start."""
DEGRADED_END = 240
"""Seconds a degraded trial's job may take to end after its kill (a fault-free one takes
30 to 45 s on 2 busy cores)."""


def test_the_degraded_trials_kill_one_rank_and_two_under_each_policy() -> None:
    """Whatever the seed, one degraded trial per batch policy, one killing one rank and
    the other two, each leaving at least ``--min_worker_num`` ranks."""
    assert [t.policy for t in DEGRADED_TRIALS] == list(POLICIES)
    assert sorted(len(t.victims) for t in DEGRADED_TRIALS) == [1, 2]
    for trial in DEGRADED_TRIALS:
        assert 1 <= trial.min_workers <= len(trial.survivors(WORKERS))
        assert trial.step in DEGRADED_STEPS
    assert degraded_schedule(SEED, WORKERS, DEGRADED_STEPS) == DEGRADED_TRIALS


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
    else:
        assert_shrink_seen(log_dir, by_step)
    wait_for(lambda: all(pid_gone(pid) for pid in job_pids(log_dir)), 10,
             f"every process of the job gone [{replay}]")
