"""Beats per node under tftrun (issue 28): the workers beat to their node's supervisor, the
supervisor beats once for the node, and a hung rank is still found and replaced (at once:
``--rejoin_cooldown=0``, where the default would hold its relaunch 30 s)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from support import events, run, spawn, spawned_pids, terminate, tftctl_cmd, tftrun_cmd, wait_for, wait_for_event
from support.sched_cluster import SCRIPT

pytestmark = pytest.mark.timeout(240)

HEARTBEAT_TIMEOUT = 5.0


def status(log_dir: Path) -> dict[str, Any]:
    done = run(tftctl_cmd("status", f"--log_dir={log_dir}", "--json"), timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_job_under_tftrun_beats_per_node_and_a_stopped_rank_is_judged_and_replaced(
        tmp_path: Path, free_port: int) -> None:
    log_dir = tmp_path / "logs"
    tftrun = spawn(tftrun_cmd("--worker_num=2", f"--log_dir={log_dir}",
                              f"--master_port={free_port}",
                              f"--recovery_path={tmp_path / 'recovery'}",
                              f"--heartbeat_timeout={HEARTBEAT_TIMEOUT:g}", "--rejoin_cooldown=0",
                              str(SCRIPT), "--steps", "0", "--rejoin"))
    try:
        wait_for_event(log_dir, 60, "generation 0", event="generation", generation=0)
        first = status(log_dir)
        [(node, seen)] = first["nodes"].items()  # one node, beating for both its ranks
        assert seen["ranks"] == 2 and not seen["silent"], first["nodes"]
        later = wait_for(lambda: (s := status(log_dir))["nodes"][node]["beats"] > seen["beats"]
                         and s, 30, "the node's next beat")
        assert later["loop"]["node_beats"] >= later["nodes"][node]["beats"] >= 2
        assert {m["state"] for m in later["members"]} == {"alive"}

        stopped = spawned_pids(log_dir)[1]
        os.kill(stopped, signal.SIGSTOP)  # its heartbeat stops with it; its process lives
        verdict = wait_for_event(log_dir, 60, "the verdict on rank 1", event="verdict", rank=1)
        # Judged by its supervisor, which stopped hearing from it, not by the node's
        # silence: the node goes on beating for rank 0.
        assert (verdict["pid"], verdict["verdict"], verdict["node"]) == (stopped, "heartbeat", node)
        assert verdict["silent_s"] > HEARTBEAT_TIMEOUT
        assert events(log_dir, "node_silent") == []
        wait_for(lambda: spawned_pids(log_dir)[1] != stopped, 60, "rank 1 relaunched")
        wait_for_event(log_dir, 90, "the generation with the relaunched rank",
                       event="generation", generation=1)
        assert [v["rank"] for v in events(log_dir, "verdict")] == [1]
    finally:
        terminate(tftrun)
