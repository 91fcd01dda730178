"""Per-rank recovery of the main job: kill -9 one rank; survivors stay; bitwise-equal end."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from recovery.events import EventLog
from support import TFT_OFF, events, kill_rank_and_wait, log_has, spawn, terminate, wait_for
from support.mnist import final_digests, mnist_job

pytestmark = pytest.mark.timeout(300)


def test_kill_9_of_rank_2_mid_epoch_rolls_back_and_ends_bitwise_equal(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    log_dir = tmp_path / "faulty"
    proc = spawn(mnist_job(tmp_path, "faulty", free_port), env=TFT_OFF)
    try:
        wait_for(lambda: log_has(log_dir, 2, "step=45 "), 120, "rank 2 past step 45")
        # A recovery must not read history (issue 28): a fault that events.jsonl dates a
        # day ahead goes unseen, while every rank parsing the file timed its recovery
        # from it (recovered.seconds = -86400).
        EventLog(log_dir).emit("fault", ts=time.time() + 86400, rank=9, cause="planted")
        first = kill_rank_and_wait(proc, log_dir, 2)
    finally:
        terminate(proc)
    assert proc.returncode == 0
    spawned = [(e["rank"], e["pid"]) for e in events(log_dir, "spawn") if e["role"] == "worker"]
    # The survivors kept their processes; only rank 2 was started again.
    assert sorted(spawned) == sorted([*first.items(), (2, spawned[-1][1])])
    assert spawned[-1][0] == 2 and spawned[-1][1] != first[2]
    assert [(e["rank"], e["cause"]) for e in events(log_dir, "fault")] == [(9, "planted"),
                                                                           (2, "SIGKILL")]
    [rollback] = events(log_dir, "rollback")
    assert rollback["source"] == "checkpoint" and rollback["step"] % 20 == 0
    assert 40 <= rollback["step"] <= 60
    [recovered] = events(log_dir, "recovered")
    assert recovered["generation"] == rollback["generation"] == 1
    assert 0 < recovered["seconds"] < 60
    assert final_digests(log_dir) == mnist_reference
