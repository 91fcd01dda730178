"""Lose nothing: replica recovery (ARF), last-words checkpoints (TTP), in-place repair (UCE).

Every run is the main job (3 ranks, 125 steps of the template's MLP); a fault is injected
at the start of a chosen step S, so the survivors' last completed step is S - 1, and
"0 steps redone" means training goes on from S - 1. Each faulty run must end with the
same parameters, bit for bit, as the fault-free run.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from launcher.cli import tftctl as ctl
from recovery.ckpt import layout
from recovery.ckpt.manifest import candidates, problem
from recovery.position import TrainPosition
from support import REPO, events, free_tcp_port, run, spawn, terminate, tftrun_cmd, wait_for, wait_for_event
from support.mnist import NARROW

pytestmark = pytest.mark.timeout(300)

TRAIN = str(REPO / "templates" / "mnist" / "train.py")
GATED = str(REPO / "tests" / "bin" / "gated.py")
# 60 steps of 3 ranks. A checkpoint every 1000 steps: only the initial one (step 0)
# exists, so resuming anywhere else proves the state came from elsewhere.
JOB = [*NARROW, "--epochs", "1", "--max_steps", "60", "--save_steps", "1000", "--synthetic_size", "12000",
       "--log_every", "5"]
KILL_STEP = 40


def tftrun(tmp_path: Path, name: str, port: int, *options: str, workers: int = 3,
           script: tuple[str, ...] = (TRAIN,)) -> list[str]:
    return tftrun_cmd(f"--worker_num={workers}", f"--log_dir={tmp_path / name}",
                      f"--recovery_path={tmp_path / 'recovery'}", f"--master_port={port}",
                      "--rejoin_cooldown=0", "--cluster_time_out=60", *options, *script, *JOB)


def digests(log_dir: Path) -> dict[int, str]:
    return {e["rank"]: e["params_sha256"] for e in events(log_dir, "train_end")}


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The fault-free run's final digest (the same on every rank)."""
    tmp_path = tmp_path_factory.mktemp("reference")
    reference = run(tftrun(tmp_path, "reference", free_tcp_port()), timeout=200)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    found = digests(tmp_path / "reference")
    assert len(found) == 3 and len(set(found.values())) == 1
    return found[0]


def worker_pids(log_dir: Path) -> list[tuple[int, int]]:
    return [(e["rank"], e["pid"]) for e in events(log_dir, "spawn") if e["role"] == "worker"]


def run_with_fault(tmp_path: Path, port: int, rank: int, fault: str, at_step: int,
                   modes: str | None = None, workers: int = 3) -> Path:
    """Run the main job with ``fault`` injected into ``rank`` at ``at_step``; it must succeed.

    The fault is queued with the scheduler before any rank registers: the workers wait
    behind a gate (tests/bin/gated.py) that opens once it is queued. (Without it, a
    worker that had imported torch before the scheduler was up registered first, and a
    single rank ran its 60 steps in 0.1 s, before its first read of the scheduler's news.)
    """
    log_dir = tmp_path / "faulty"
    gate = tmp_path / "gate"
    env = {**os.environ, **({"MS_ENABLE_TFT": modes} if modes else {})}
    proc = spawn(tftrun(tmp_path, "faulty", port, workers=workers,
                        script=(GATED, str(gate), TRAIN)), env=env)
    try:
        wait_for_event(log_dir, 60, "the scheduler up", event="scheduler_start")
        assert ctl.main(["inject", f"--log_dir={log_dir}", f"--rank={rank}", f"--fault={fault}",
                         f"--at_step={at_step}"]) == 0
        gate.touch()
        out, err = proc.communicate(timeout=240)
    finally:
        terminate(proc)
    assert proc.returncode == 0, out + err
    return log_dir


@pytest.mark.parametrize("rank", [0, 2])
def test_replica_recovery_redoes_no_step_and_reads_no_checkpoint(
        tmp_path: Path, free_port: int, expected: str, rank: int) -> None:
    log_dir = run_with_fault(tmp_path, free_port, rank, "kill", KILL_STEP, modes="{ARF:1}")
    pids = worker_pids(log_dir)
    assert [r for r, _ in pids] == [0, 1, 2, rank]  # only the killed rank started again
    [rollback] = events(log_dir, "rollback")
    # The only file holds step 0: step 39 came from a replica, over the process group.
    assert (rollback["source"], rollback["step"]) == ("replica", KILL_STEP - 1)
    assert rollback["from_rank"] != rank
    assert not events(log_dir, "last_words_saved")
    assert digests(log_dir) == {0: expected, 1: expected, 2: expected}


@pytest.mark.parametrize("rank", [0, 2])
def test_last_words_of_the_last_completed_step_are_saved_and_resumed(
        tmp_path: Path, free_port: int, expected: str, rank: int) -> None:
    log_dir = run_with_fault(tmp_path, free_port, rank, "kill", KILL_STEP, modes="{TTP:1}")
    n = KILL_STEP - 1
    [saved] = events(log_dir, "last_words_saved")
    assert saved["step"] == n and saved["rank"] != rank
    for r in range(3):
        path = layout.ttp_checkpoint_path(tmp_path / "recovery", r, TrainPosition(1, n, n))
        assert path.is_file(), path
        [candidate] = candidates(path.parent)
        assert candidate.path == path and problem(candidate) is None
    [rollback] = events(log_dir, "rollback")
    assert (rollback["source"], rollback["step"]) == ("last_words", n)
    # Timed from when the scheduler heard of the fault, which a relaunched rank 0 learns
    # when it registers: at least its start, its registration and its restore, 0.28 s
    # seen forked from the fork server (a fallback to "now" gives a few milliseconds).
    [recovered] = events(log_dir, "recovered")
    assert 0.05 < recovered["seconds"] < 120
    assert digests(log_dir) == {0: expected, 1: expected, 2: expected}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_stopped_job_resumes_from_its_last_words_at_the_next_step(
        tmp_path: Path, free_port: int, expected: str, sig: int) -> None:
    """SIGTERM, or Slurm's preemption warning SIGUSR1 (``--signal=USR1@90``): tftrun
    passes the signal on, one rank saves the last words, and the resumed job loses no step."""
    log_dir = tmp_path / "faulty"
    proc = spawn(tftrun(tmp_path, "faulty", free_port))
    try:
        worker_0 = log_dir / "worker_0.log"
        wait_for(lambda: worker_0.exists() and "step=20 " in worker_0.read_text(), 120,
                 "rank 0 past step 20")
        proc.send_signal(sig)
        proc.communicate(timeout=60)
    finally:
        terminate(proc)
    assert proc.returncode == 128 + sig
    [saved] = events(log_dir, "last_words_saved")
    assert 20 <= saved["step"] < 60
    resumed = run(tftrun(tmp_path, "resumed", free_port, "--is_recover=1"), timeout=200)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    [rollback] = events(tmp_path / "resumed", "rollback")
    assert (rollback["source"], rollback["step"]) == ("last_words", saved["step"])
    assert digests(tmp_path / "resumed") == {0: expected, 1: expected, 2: expected}


@pytest.mark.parametrize("rank", [1, 0])
def test_device_error_is_repaired_in_place(tmp_path: Path, free_port: int, expected: str,
                                           rank: int) -> None:
    log_dir = run_with_fault(tmp_path, free_port, rank, "uce", KILL_STEP)
    assert len(worker_pids(log_dir)) == 3  # no process was started again
    [fault] = events(log_dir, "fault")
    assert (fault["rank"], fault["cause"]) == (rank, "uce")
    [rollback] = events(log_dir, "rollback")
    assert (rollback["source"], rollback["step"], rollback["generation"]) == ("in_place", KILL_STEP - 1, 0)
    assert rollback["from_rank"] != rank
    [recovered] = events(log_dir, "recovered")
    assert recovered["seconds"] < 10
    assert digests(log_dir) == {0: expected, 1: expected, 2: expected}


def test_a_device_error_with_no_replica_falls_back_to_the_newest_checkpoint(
        tmp_path: Path, free_port: int) -> None:
    """World size 1: nobody to copy from; the rank rolls back (to step 0, the only file)."""
    log_dir = run_with_fault(tmp_path, free_port, 0, "uce", KILL_STEP, workers=1)
    assert len(worker_pids(log_dir)) == 1
    [fallback] = events(log_dir, "fallback")
    assert fallback["mode"] == "in_place" and "no healthy replica" in fallback["reason"]
    [rollback] = events(log_dir, "rollback")
    assert (rollback["source"], rollback["step"]) == ("checkpoint", 0)
    [end] = events(log_dir, "train_end")
    assert end["step"] > KILL_STEP
