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
  after as many steps and samples (bitwise equality cannot hold across a change of W);
* a second run that replays the killed run's membership changes (``TFT_REPLAY_MEMBERSHIP``)
  has the same generations from the same steps, and every rank's parameters after every
  step bitwise equal to the killed run's.

The job and these checks are tests/support/degraded.py's, shared with the chaos test's
degraded trials, and so is the fault-free run (``degraded_reference``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recovery import env as names
from recovery.events import read_events
from recovery.train.replay import recorded_changes
from support import REPO, events, free_tcp_port, run, run_gated_with_kills, tftrun_cmd
from support.degraded import (
    BATCH,
    JOB,
    STEPS,
    STEPS_PER_EPOCH,
    TRAIN,
    WORKERS,
    Committed,
    assert_loss_within_tolerance,
    assert_trained_through,
    committed_lines,
    degraded_job,
    degraded_steps,
    last_committers,
)

pytestmark = pytest.mark.timeout(300)

GATED = str(REPO / "tests" / "bin" / "gated.py")
KILL_STEP, KILLED = 40, 1
DEFAULTS_EPOCHS = 2
"""The defaults' test trains 2 of the job's 3 epochs: the survivors' training alone is
what it checks, not the heal (test_survivors_train_through_a_kill_and_the_relaunched_rank_heals)."""


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


def test_the_recorded_membership_changes_replay_to_a_bitwise_equal_final_state(
        degraded: Path, tmp_path: Path, free_port: int) -> None:
    """The killed run replayed (docs/elastic.md#replaying-a-run): no kill from outside; rank 1
    kills itself before the step after the one the record lost it at, and the survivors
    take the relaunched rank in at the step the record healed it at, whether it is ready
    sooner (the usual case: its cooldown is 2 s here, 5 s in the killed run; the survivors
    hold its generation off) or later (they wait for it there). Every step then has the
    same ranks and shares, so the same sums.

    Not asserted: that the generation was held, which depends on the two runs' speeds; nor
    a cooldown of 0, with which the relaunched rank can be ready before the survivors have
    joined the degraded generation, which is then skipped (not replayable)."""
    env = {**os.environ, names.TFT_REPLAY_MEMBERSHIP: str(degraded / "logs")}
    replay = run(degraded_job(tmp_path, free_port, cooldown=2), timeout=250, env=env)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    recorded = recorded_changes(read_events(degraded / "logs"))
    assert [(c.generation, c.why, c.active) for c in recorded] == [
        (0, "start", (0, 1, 2)), (1, "shrink", (0, 2)), (2, "grow", (0, 1, 2))]
    assert recorded[1].step == KILL_STEP - 1 < recorded[2].step  # type: ignore[operator]
    assert recorded_changes(read_events(tmp_path / "logs")) == recorded
    replayed, killed_run = set(committed_lines(tmp_path / "logs")), set(committed_lines(degraded / "logs"))
    assert states(replayed) == states(killed_run)
    # A member of the killed run that saw the grow before its step's all-reduce returned
    # voided the step and took a committer's state (no line); the replay's members all
    # commit the record's step before they leave for the grow.
    assert killed_run <= replayed, sorted(killed_run - replayed)

    def ends(folder: Path) -> dict[int, str]:
        return {e["rank"]: e["params_sha256"] for e in events(folder / "logs", "train_end")}

    assert ends(tmp_path) == ends(degraded) and set(ends(degraded)) == {0, 1, 2}


def states(lines: set[Committed]) -> set[tuple[int, int, int, int, str]]:
    """Each committed step's generation, world, cursor and parameters, whichever ranks
    logged it."""
    return {(line.step, line.generation, line.world, line.cursor, line.digest) for line in lines}


def test_with_tftrun_defaults_the_survivors_train_through_a_kill(tmp_path: Path) -> None:
    """No ``--min_worker_num``, the real 30 s cooldown: degraded training is tftrun's
    default for a script that uses recovery. The survivors train on at W = 2 at once,
    and the job ends 0 with as many steps as a fault-free run, whether or not the
    relaunched rank was back before the end (the job's :data:`DEFAULTS_EPOCHS` epochs
    usually end within its cooldown)."""
    log_dir, gate = tmp_path / "logs", tmp_path / "gate"
    command = tftrun_cmd(f"--worker_num={WORKERS}", f"--log_dir={log_dir}",
                         f"--recovery_path={tmp_path / 'recovery'}",
                         f"--master_port={free_tcp_port()}", GATED, str(gate), TRAIN, *JOB,
                         "--epochs", str(DEFAULTS_EPOCHS), degraded=True)
    assert not [arg for arg in command if arg.startswith("--min_worker_num")]
    status, output = run_gated_with_kills(command, log_dir, gate, [KILLED], KILL_STEP, timeout=280)
    assert status == 0, output
    changes = [(e["why"], e["active"]) for e in events(log_dir, "membership")]
    assert changes[:2] == [("start", [0, 1, 2]), ("shrink", [0, 2])], changes
    assert changes[2:] in ([], [("grow", [0, 1, 2])]), changes
    survivors = [line for line in committed_lines(log_dir) if line.world == WORKERS - 1]
    assert {line.rank for line in survivors} == {0, 2}, "the survivors did not train alone"
    ends = {e["rank"]: e for e in events(log_dir, "train_end")}
    assert {0, 2} <= set(ends) and {e["step"] for e in ends.values()} == {
        DEFAULTS_EPOCHS * STEPS_PER_EPOCH}
    assert len({e["params_sha256"] for e in ends.values()}) == 1
    [job_end] = events(log_dir, "job_end")
    assert job_end["exitcode"] == 0
