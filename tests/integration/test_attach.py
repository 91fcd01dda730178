"""pytorch/examples' DDP tutorial under ``recovery.attach`` (tests/bin/ddp_tutorial_attached.py),
run for real on 2 ranks: a ``kill -9`` of rank 1 relaunches rank 1 alone; rank 0 keeps its
process and its DDP, trains on through the cooldown, and the relaunched rank takes its
state from rank 0. A SIGTERM to the job leaves last words to resume from. Nothing is
redone and nothing is lost."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import BIN, events, spawn, spawned_pids, terminate, tftrun_cmd, wait_for

pytestmark = pytest.mark.timeout(240)

SCRIPT = str(BIN / "ddp_tutorial_attached.py")
EPOCHS = 8
STEPS_PER_EPOCH = 2048 // 2 // 32
KILL_AT = 40
"""Rank 1 is killed once a rank reported this global step (of ``EPOCHS * STEPS_PER_EPOCH``)."""
COOLDOWN = "--rejoin_cooldown=1"
"""Instead of the 30 s default, so that rank 1 is back while rank 0 still trains."""
FINAL = re.compile(r"^final loss=(\S+) params_sha256=(\w+)$", re.MULTILINE)


@dataclass(frozen=True)
class Finished:
    """What a run of the tutorial printed and recorded."""

    logs: Path
    losses: dict[int, float]
    hashes: dict[int, str]


def _start(home: Path, logs: Path, *options: str, model: dict[str, str] | None = None
           ) -> subprocess.Popen[str]:
    """The tutorial, 2 ranks, in its own working folder (it writes its snapshot there);
    ``model``: the variables that choose another model."""
    home.mkdir(exist_ok=True)
    env = {**os.environ, "STEP_SECONDS": "0.02", **(model or {})}
    return spawn(tftrun_cmd("--nproc_per_node=2", f"--log_dir={logs}",
                            f"--recovery_path={home / 'recovery'}", *options, SCRIPT,
                            str(EPOCHS), "1", degraded=True), cwd=home, env=env)


def _wait_for_step(proc: subprocess.Popen[str], logs: Path) -> None:
    wait_for(lambda: proc.poll() is None and any(
        e["step"] >= KILL_AT for e in events(logs, "step")), 120, f"step {KILL_AT}")


def _finish(proc: subprocess.Popen[str], logs: Path) -> Finished:
    try:
        proc.communicate(timeout=180)
    finally:
        terminate(proc)
    assert proc.returncode == 0
    finals = {rank: FINAL.findall((logs / f"worker_{rank}.log").read_text(errors="ignore"))
              for rank in (0, 1)}
    return Finished(logs, {rank: float(found[-1][0]) for rank, found in finals.items()},
                    {rank: found[-1][1] for rank, found in finals.items()})


def _run(home: Path, *options: str, kill: bool, model: dict[str, str] | None = None) -> Finished:
    logs = home / "logs"
    proc = _start(home, logs, *options, model=model)
    if kill:
        try:
            _wait_for_step(proc, logs)
            os.kill(spawned_pids(logs)[1], signal.SIGKILL)
        except BaseException:
            terminate(proc)
            raise
    return _finish(proc, logs)


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    return _run(tmp_path_factory.mktemp("attach") / "fault_free", kill=False)


def _worker_spawns(logs: Path) -> list[tuple[int, int]]:
    return [(e["rank"], e["pid"]) for e in events(logs, "spawn") if e["role"] == "worker"]


def test_a_killed_rank_is_relaunched_alone_while_the_survivor_trains_on(
        tmp_path: Path, fault_free: Finished) -> None:
    """tftrun's defaults but the cooldown: rank 0 keeps its pid, trains alone (degraded:
    each step still trains both ranks' micro-batches), rank 1 comes back into the same
    run from rank 0's state, and both end with the same parameters and the fault-free
    run's loss within 1e-4 (only the summation order differed)."""
    run = _run(tmp_path / "killed", COOLDOWN, kill=True)
    spawns = _worker_spawns(run.logs)
    assert sorted(rank for rank, _pid in spawns) == [0, 1, 1]
    assert not [e for e in events(run.logs, "restart") if e["what"] == "workers"]
    assert [e["why"] for e in events(run.logs, "membership")] == ["start", "shrink", "grow"]
    # The survivor trained every epoch once, in its one process: nothing redone.
    epochs = re.findall(r"^\[GPU0\] Epoch (\d+)", (run.logs / "worker_0.log").read_text(),
                        re.MULTILINE)
    assert epochs == [str(epoch) for epoch in range(EPOCHS)]
    grow = events(run.logs, "membership")[-1]["generation"]
    assert [(e["source"], e["from_rank"]) for e in events(run.logs, "rollback")
            if e["generation"] == grow] == [("replica", 0)]
    shrunk = [e for e in events(run.logs, "step") if e["generation"] == grow - 1]
    assert shrunk and {e["rank"] for e in shrunk} == {0}
    assert {e["batch"] for e in shrunk} - {None} == {64}  # the global batch: 2 ranks x 32
    assert [e["step"] for e in events(run.logs, "train_end")] == [EPOCHS * STEPS_PER_EPOCH] * 2
    assert run.hashes[0] == run.hashes[1]
    assert abs(run.losses[0] - fault_free.losses[0]) <= 1e-4 * abs(fault_free.losses[0])


def test_a_model_with_buffers_keeps_its_survivor_when_the_peer_dies_between_two_steps(
        tmp_path: Path) -> None:
    """A BatchNorm layer in front: DDP's forward broadcasts its buffers, a collective
    outside the comm hook. The kill lands mostly in the survivor's sleep after its step,
    so its next collective is that broadcast: it is made fault-aware at the step's start
    (recovery/train/ddp_exchange.py), the step is voided, and the survivor keeps its
    process instead of dying in the script's forward. Both ranks end with equal
    parameters."""
    run = _run(tmp_path / "killed", COOLDOWN, kill=True, model={"TUTORIAL_BATCHNORM": "1"})
    assert sorted(rank for rank, _pid in _worker_spawns(run.logs)) == [0, 1, 1]
    assert [e["why"] for e in events(run.logs, "membership")] == ["start", "shrink", "grow"]
    ends = events(run.logs, "train_end")
    assert [e["step"] for e in ends] == [EPOCHS * STEPS_PER_EPOCH] * 2
    assert ends[0]["params_sha256"] == ends[1]["params_sha256"]


@pytest.mark.parametrize("loader_workers", ["0", "2"])
def test_with_min_worker_num_at_the_jobs_size_the_run_ends_bitwise_equal_to_a_fault_free_one(
        tmp_path: Path, fault_free: Finished, loader_workers: str) -> None:
    """``--min_worker_num=2``: rank 0 waits in place for rank 1 instead of training on;
    the step the death voided is redone, DDP's buckets are reduced in the same fixed
    layout before and after, and the final parameters equal the fault-free run's bit for
    bit. With the loader's ``num_workers=2`` the batches are loaded ahead in its worker
    processes (recovery/train/planned_loader.py), and the re-form's new plan starts a new
    loader: the same batches, bit for bit, as the fault-free run's in-process ones."""
    run = _run(tmp_path / "killed", COOLDOWN, "--min_worker_num=2", kill=True,
               model={"TUTORIAL_WORKERS": loader_workers})
    assert sorted(rank for rank, _pid in _worker_spawns(run.logs)) == [0, 1, 1]
    assert [e["source"] for e in events(run.logs, "rollback")] == ["replica"]
    assert run.hashes == fault_free.hashes


def test_a_stopped_job_resumes_from_its_last_words_and_ends_bitwise_equal(
        tmp_path: Path, fault_free: Finished) -> None:
    """SIGTERM to tftrun (a preemption): each rank finishes its step, one saves the last
    words (every rank's state of the last completed step) and all exit 143; the job run
    again with ``--is_recover=1`` rolls back to them and ends as the fault-free run."""
    home, logs = tmp_path / "stopped", tmp_path / "stopped" / "logs"
    proc = _start(home, logs)
    try:
        _wait_for_step(proc, logs)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        terminate(proc)
    assert proc.returncode == 128 + signal.SIGTERM
    [saved] = events(logs, "last_words_saved")
    assert saved["step"] >= KILL_AT
    resumed = _finish(_start(home, home / "resumed", "--is_recover=1"), home / "resumed")
    [rollback] = events(home / "resumed", "rollback")
    assert (rollback["source"], rollback["step"]) == ("last_words", saved["step"])
    assert resumed.hashes == fault_free.hashes
