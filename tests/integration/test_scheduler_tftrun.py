"""The scheduler under tftrun: its kill -9 restarts no worker and the job finishes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from sched_cluster import SCRIPT
from support import events, spawn, terminate, tftrun_cmd, wait_for, wait_for_event

pytestmark = pytest.mark.timeout(120)


def test_kill_9_of_the_scheduler_under_tftrun_restarts_no_worker_and_the_job_finishes(
        tmp_path: Path, free_port: int) -> None:
    log_dir = tmp_path / "logs"
    tftrun = spawn(tftrun_cmd("--worker_num=2", f"--log_dir={log_dir}",
                              f"--master_port={free_port}",
                              f"--recovery_path={tmp_path / 'recovery'}",
                              str(SCRIPT), "--steps", "120"))
    try:
        wait_for_event(log_dir, 60, "generation 0", event="generation", generation=0)
        for log in (log_dir / "worker_0.log", log_dir / "worker_1.log"):
            # Past the rendezvous: the only moment the workers need the store.
            wait_for(lambda log=log: "in generation 0" in log.read_text(), 60, f"{log} training")
        first = events(log_dir, "scheduler_start")[0]
        os.kill(first["pid"], signal.SIGKILL)
        wait_for_event(log_dir, 60, "the relaunched scheduler", event="scheduler_start",
                       reloaded=True)
        workers = {e["rank"]: e["pid"] for e in events(log_dir, "register")}
        for pid in workers.values():
            wait_for_event(log_dir, 30, f"pid {pid} re-attached", event="attach", pid=pid)
        assert tftrun.wait(60) == 0, tftrun.stderr.read() if tftrun.stderr else ""
        spawned = [e for e in events(log_dir, "spawn") if e["role"] == "worker"]
        assert {e["rank"]: e["pid"] for e in spawned} == workers and len(spawned) == 2
        assert [e["what"] for e in events(log_dir, "restart")] == ["scheduler"]
        finished = {e["pid"] for e in events(log_dir, "leave") if e["state"] == "finished"}
        assert finished == set(workers.values())
    finally:
        terminate(tftrun)
