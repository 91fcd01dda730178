"""Per-rank recovery of the main job: kill -9 one rank; survivors stay; bitwise-equal end."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from support import REPO, events, run, spawn, terminate, tftrun_cmd, wait_for

pytestmark = pytest.mark.timeout(300)

TRAIN = str(REPO / "templates" / "mnist" / "train.py")
# 125 steps of 3 ranks; a checkpoint every 20 steps.
JOB = ["--epochs", "1", "--save_steps", "20", "--synthetic_size", "12000", "--log_every", "5"]


# The lose-nothing modes off: what is left is the rollback to a common checkpoint.
ROLLBACK_ONLY = {**os.environ, "MS_ENABLE_TFT": "{TTP:0,UCE:0,ARF:0}"}


def tftrun(tmp_path: Path, name: str, port: int) -> list[str]:
    return tftrun_cmd("--worker_num=3", f"--log_dir={tmp_path / name}",
                      f"--recovery_path={tmp_path / (name + '_recovery')}", f"--master_port={port}",
                      "--rejoin_cooldown=0", "--cluster_time_out=60", TRAIN, *JOB)


def final_digests(log_dir: Path) -> dict[int, str]:
    return {e["rank"]: e["params_sha256"] for e in events(log_dir, "train_end")}


def test_kill_9_of_rank_2_mid_epoch_rolls_back_and_ends_bitwise_equal(
        tmp_path: Path, free_port: int) -> None:
    reference = run(tftrun(tmp_path, "reference", free_port), timeout=200)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    expected = final_digests(tmp_path / "reference")
    assert len(set(expected.values())) == 1 and len(expected) == 3

    log_dir = tmp_path / "faulty"
    proc = spawn(tftrun(tmp_path, "faulty", free_port), env=ROLLBACK_ONLY)
    try:
        worker_2 = log_dir / "worker_2.log"
        wait_for(lambda: worker_2.exists() and "step=45 " in worker_2.read_text(), 120,
                 "rank 2 past step 45")
        first = {e["rank"]: e["pid"] for e in events(log_dir, "spawn") if e["role"] == "worker"}
        os.kill(first[2], signal.SIGKILL)
        proc.communicate(timeout=200)
    finally:
        terminate(proc)
    assert proc.returncode == 0
    spawned = [(e["rank"], e["pid"]) for e in events(log_dir, "spawn") if e["role"] == "worker"]
    # The survivors kept their processes; only rank 2 was started again.
    assert sorted(spawned) == sorted([*first.items(), (2, spawned[-1][1])])
    assert spawned[-1][0] == 2 and spawned[-1][1] != first[2]
    assert [(e["rank"], e["cause"]) for e in events(log_dir, "fault")] == [(2, "SIGKILL")]
    [rollback] = events(log_dir, "rollback")
    assert rollback["source"] == "checkpoint" and rollback["step"] % 20 == 0
    assert 40 <= rollback["step"] <= 60
    [recovered] = events(log_dir, "recovered")
    assert recovered["generation"] == rollback["generation"] == 1
    assert final_digests(log_dir) == expected
