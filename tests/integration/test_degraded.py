"""Training through a fault (docs/elastic.md): a real ``kill -9`` under tftrun with
``--min_worker_num`` below ``--worker_num``.

The survivors of the kill train on at once in a degraded generation, with the same
global batch; the killed rank is relaunched after its cooldown (shortened here to
``--rejoin_cooldown=5`` so the job need not train for the default 30 s), heals from a live
rank at a step boundary, and the job ends whole. What must hold, read from every rank's
``committed ...`` log lines (``--log_params_hash``):

* after every committed step every active rank that committed it holds the same parameter
  hash (a rank that saw a membership change before the step's all-reduce completed voids
  it and takes a committer's state: its next step's hash agrees);
* the healed rank's state equals its donors' after its first step;
* each step's shares cover its micro-batches once, and the epoch's committed samples are
  a permutation of the data set;
* the final loss is within ``LOSS_TOLERANCE`` of a fault-free run's with the same seed,
  after as many steps and samples (bitwise equality cannot hold across a change of W).

The job and these checks are tests/support_degraded.py's, shared with the chaos test's
degraded trials, and so is the fault-free run (``degraded_reference``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support import REPO, events, free_tcp_port, run_gated_with_kills
from support_degraded import (
    BATCH,
    STEPS,
    WORKERS,
    assert_loss_within_tolerance,
    assert_trained_through,
    degraded_job,
    degraded_steps,
    last_committers,
)

pytestmark = pytest.mark.timeout(300)

GATED = str(REPO / "tests" / "bin" / "gated.py")
KILL_STEP, KILLED = 40, 1


def run_with_kill(tmp_path: Path, *job: str) -> None:
    """The job with rank 1 killed at step 40; it must end 0."""
    log_dir, gate = tmp_path / "logs", tmp_path / "gate"
    command = degraded_job(tmp_path, free_tcp_port(), script=(GATED, str(gate)), job=job)
    status, output = run_gated_with_kills(command, log_dir, gate, [KILLED], KILL_STEP, timeout=280)
    assert status == 0, output


@pytest.fixture(scope="module")
def degraded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job with rank 1 killed at step 40 (constant global batch); its folder."""
    tmp_path = tmp_path_factory.mktemp("degraded")
    run_with_kill(tmp_path)
    return tmp_path


def test_the_final_loss_stays_within_the_tolerance_of_a_fault_free_run(
        degraded: Path, degraded_reference: float) -> None:
    assert {e["step"] for e in events(degraded / "logs", "train_end")} == {STEPS}
    assert_loss_within_tolerance(degraded / "recovery", degraded_reference)


def test_survivors_train_through_a_kill_and_the_relaunched_rank_heals(degraded: Path) -> None:
    log_dir = degraded / "logs"
    changes = [(e["why"], e["active"], e["world"]) for e in events(log_dir, "membership")]
    assert changes == [("start", [0, 1, 2], 3), ("shrink", [0, 2], 2), ("grow", [0, 1, 2], 3)]
    by_step = assert_trained_through(log_dir, "constant")
    assert degraded_steps(by_step), "no step was trained by the survivors alone"
    healed = [step for step in sorted(by_step) if step > KILL_STEP
              and any(m.rank == KILLED and m.world == WORKERS for m in last_committers(by_step, step))]
    assert healed and healed[0] < STEPS, "the relaunched rank did not heal before the end"
    # The live view's samples/s: every step trained the same global batch, degraded or not.
    assert {e["batch"] for e in events(log_dir, "step") if e["batch"] is not None} \
        == {WORKERS * BATCH}


def test_with_the_shrink_policy_each_sample_is_trained_at_most_once(tmp_path: Path) -> None:
    """``--batch_policy=shrink``: a degraded step trains one micro-batch per live rank, so
    an epoch has more steps; the shares of each step are distinct micro-batches, the
    active ranks agree after every step, and only an epoch's tail may stay untrained."""
    run_with_kill(tmp_path, "--batch_policy", "shrink")
    by_step = assert_trained_through(tmp_path / "logs", "shrink")
    assert degraded_steps(by_step), "no step was trained by the survivors alone"
    assert len(by_step) > STEPS  # more, smaller steps
    # The step events' total is where the loop ends if the membership holds: never behind
    # the step, and, the job whole again, its real end.
    step_events = events(tmp_path / "logs", "step")
    behind = [(e["rank"], e["step"], e["total"]) for e in step_events if e["step"] > e["total"]]
    assert not behind, f"step events past their total: {behind[:5]}"
    last = {e["rank"]: e["total"] for e in step_events}
    assert last == dict.fromkeys((0, 1, 2), max(by_step)), last
    # A degraded step trained W micro-batches: the live view's samples/s says so.
    assert {e["batch"] for e in step_events if e["batch"] is not None} \
        == {WORKERS * BATCH, (WORKERS - 1) * BATCH}
