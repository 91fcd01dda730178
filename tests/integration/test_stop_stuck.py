"""Stopping a job whose survivors are stuck in a collective (issue 15).

One rank is frozen (SIGSTOP) in the middle of training, so its peers block in the next
gradient all-reduce; the scheduler is told to wait long before declaring it dead, so no
new generation releases them. Then tftrun is stopped (SIGTERM). The survivors must notice
the stop while they wait, save the last words of their last completed step and exit on
their own within tftrun's grace period; only the frozen rank is killed (SIGKILL).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from recovery.ckpt import layout
from recovery.position import TrainPosition
from support import events, spawn, spawned_pids, terminate, tftrun_cmd, wait_for
from support.mnist import NARROW, TRAIN

pytestmark = pytest.mark.timeout(240)

FROZEN = 1
GRACE = 10.0
"""Spent whole on every run: the frozen rank never exits by itself, while the survivors
need a fraction of it."""
JOB = (*NARROW, "--epochs", "50", "--save_steps", "1000", "--synthetic_size", "12000", "--log_every", "1")


def test_sigterm_during_a_stuck_collective_saves_last_words_and_exits_in_the_grace(
        tmp_path: Path, free_port: int) -> None:
    log_dir = tmp_path / "logs"
    proc = spawn(tftrun_cmd("--worker_num=3", f"--log_dir={log_dir}",
                            f"--recovery_path={tmp_path / 'recovery'}",
                            f"--master_port={free_port}", "--heartbeat_timeout=200",
                            f"--grace_period={GRACE:g}", str(TRAIN), *JOB))
    try:
        worker_0 = log_dir / "worker_0.log"
        wait_for(lambda: worker_0.exists() and "step=20 " in worker_0.read_text(), 150,
                 "rank 0 past step 20")
        os.kill(spawned_pids(log_dir)[FROZEN], signal.SIGSTOP)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=GRACE + 60)
    finally:
        terminate(proc)
    assert proc.returncode == 143
    exits = {e["rank"]: e for e in events(log_dir, "exit") if e["role"] == "worker"}
    assert exits[FROZEN].get("signal") == "SIGKILL"
    for survivor in (0, 2):
        assert "signal" not in exits[survivor], exits[survivor]  # not killed at the grace's end
        assert exits[survivor]["exitcode"] == 143, exits[survivor]
    [saved] = events(log_dir, "last_words_saved")
    assert saved["rank"] != FROZEN and saved["step"] >= 20
    for rank in range(3):
        path = layout.ttp_checkpoint_path(tmp_path / "recovery", rank, TrainPosition(
            saved["epoch"], saved["step_in_epoch"], saved["step"]))
        assert path.is_file(), path
