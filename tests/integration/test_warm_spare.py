"""A relaunch is warm without a spare: every worker, first launch or relaunch, is forked
by the fork server; ``--warm_spare`` is still accepted, says in one line that it does
nothing, and keeps no process."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import (
    BIN,
    TFT_OFF,
    events,
    kill_rank_and_wait,
    log_has,
    run,
    spawn,
    spawned_pids,
    terminate,
    tftrun_cmd,
    wait_for,
)
from support.mnist import final_digests, mnist_job

pytestmark = pytest.mark.timeout(300)

DEPRECATED = ("tftrun: --warm_spare is deprecated and has no effect: the fork server (on by default) "
              "starts every worker and relaunch warm")


def test_kill_9_of_rank_2_is_relaunched_forked_warm_and_ends_bitwise_equal(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    """With tftrun's defaults: the relaunched rank is forked from the node's warm fork
    server, as its first launch was, and its training output follows its launch's header."""
    log_dir = tmp_path / "warm"
    proc = spawn(mnist_job(tmp_path, "warm", free_port), env=TFT_OFF)
    try:
        wait_for(lambda: log_has(log_dir, 2, "step=25 "), 120, "rank 2 past step 25")
        assert not log_has(log_dir, 2, "step=80 "), "the job ended before the kill"
        first = kill_rank_and_wait(proc, log_dir, 2)
    finally:
        terminate(proc)
    assert proc.returncode == 0
    spawns = [e for e in events(log_dir, "spawn") if e["role"] == "worker"]
    assert [(e["rank"], e["incarnation"], e.get("forked")) for e in spawns] == [
        (0, 0, True), (1, 0, True), (2, 0, True), (2, 1, True)]
    assert spawns[-1]["pid"] != first[2]
    assert [(e["rank"], e["cause"]) for e in events(log_dir, "fault")] == [(2, "SIGKILL")]
    assert final_digests(log_dir) == mnist_reference
    log = (log_dir / "worker_2.log").read_text()
    assert "step=80 " in log[log.index("==== tftrun: worker rank=2 incarnation=1 "):]


def test_a_restart_of_all_workers_forks_them_again(tmp_path: Path) -> None:
    """A plain torchrun script (never registers): rank 1's failure restarts every worker,
    each forked warm; the failure again spends the budget."""
    log_dir, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    ckpt.mkdir()
    result = run(tftrun_cmd("--worker_num=2", f"--log_dir={log_dir}", "--max_restarts=1",
                            str(BIN / "plain_resumable.py"), "50", str(ckpt), "1", "3"), timeout=180)
    assert result.returncode == 3, result.stderr[-2000:]
    spawns = [e for e in events(log_dir, "spawn") if e["role"] == "worker"]
    assert [(e["rank"], e["restart_count"], e.get("forked")) for e in spawns] == [
        (0, 0, True), (1, 0, True), (0, 1, True), (1, 1, True)]


def test_warm_spare_is_accepted_says_once_that_it_does_nothing_and_keeps_no_spare(
        tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    script = tmp_path / "quick.py"
    script.write_text("print('done')\n")
    result = run(tftrun_cmd("--warm_spare=2", "--worker_num=2", f"--log_dir={log_dir}", str(script)),
                 timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [line for line in result.stderr.splitlines() if "warm_spare" in line] == [DEPRECATED]
    assert {e["role"] for e in events(log_dir, "spawn")} == {"worker", "scheduler"}
    assert set(spawned_pids(log_dir)) == {0, 1}
    assert not (log_dir / "spare.log").exists()
