"""A job only ever restores its own state: another job's checkpoints are never mixed in.

Job A (seed 7) runs 100 steps and leaves its checkpoints in the recovery path. The user
clears the log dir, keeps the recovery path, and starts job B (the main job, seed 1,
80 steps) fresh in the same folders. Rank 2 of B is ``kill -9``ed mid-run: B must roll
back to one of its *own* checkpoints and end bitwise equal to B's fault-free run, never
jump to A's newer step 100 and end with A's parameters.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from launcher.cli import tftctl as ctl
from recovery.ckpt import layout
from recovery.ckpt.lineage import read_lineage
from support import TFT_OFF, events, kill_rank_and_wait, log_has, run, spawn, terminate, wait_for
from support.mnist import JOB, NARROW, final_digests, mnist_job

pytestmark = pytest.mark.timeout(400)

JOB_A = (*NARROW, "--epochs", "1", "--max_steps", "100", "--save_steps", "20", "--synthetic_size", "12000",
         "--log_every", "5", "--seed", "7")
"""Another job: other weights, and a newest checkpoint (step 100) past B's last step (80)."""


def test_a_fresh_job_never_rolls_back_to_an_earlier_jobs_checkpoints(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    log_dir = tmp_path / "job"
    recovery_path = tmp_path / "job_recovery"
    first = run(mnist_job(tmp_path, "job", free_port, job=JOB_A), timeout=240, env=TFT_OFF)
    assert first.returncode == 0, first.stdout + first.stderr
    digests_a = final_digests(log_dir)
    assert len(set(digests_a.values())) == 1 and digests_a != mnist_reference
    shutil.rmtree(log_dir)  # the user clears logs/ and keeps the recovery path

    proc = spawn(mnist_job(tmp_path, "job", free_port, job=JOB), env=TFT_OFF)
    try:
        wait_for(lambda: log_has(log_dir, 2, "step=25 "), 120, "rank 2 of job B past step 25")
        kill_rank_and_wait(proc, log_dir, 2)
    finally:
        terminate(proc)
    assert proc.returncode == 0
    [rollback] = events(log_dir, "rollback")
    assert rollback["source"] == "checkpoint" and 20 <= rollback["step"] <= 40, rollback
    assert final_digests(log_dir) == mnist_reference
    # A's checkpoints were moved aside, not deleted; B runs in a lineage of its own.
    archived = recovery_path / "previous" / "1"
    assert (layout.rank_dir(archived, 0) / "mnist-1_100.ckpt").is_file()
    [start] = events(log_dir, "job_start")
    assert read_lineage(recovery_path) == start["lineage"] != read_lineage(archived)
    assert ctl.main(["ckpt", "ls", str(recovery_path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if ".ckpt" in line]
    assert rows and all(start["lineage"] in row and "previous" not in row for row in rows)
