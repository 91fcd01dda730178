"""templates/run.sh and templates/recover.sh: msrun's manual flow, with 2 workers."""

from __future__ import annotations

import os
import re
import signal
import sys
from contextlib import ExitStack, closing
from pathlib import Path

import pytest
from sched_cluster import SCRIPT, cluster_env
from support import REPO, events, pid_gone, run, wait_for, wait_for_event

from recovery.control.client import SchedulerControl

pytestmark = pytest.mark.timeout(120)

RUN_SH = REPO / "templates" / "run.sh"
RECOVER_SH = REPO / "templates" / "recover.sh"


def launch(script: Path, *args: str, env: dict[str, str], cwd: Path) -> dict[str, int]:
    """Run a launch script; return the pids it says it started, by process name."""
    result = run(["bash", str(script), *args], env=env, cwd=cwd, timeout=60)
    assert result.returncode == 0, result.stderr
    return {name: int(pid) for name, pid in re.findall(r"^(.+): pid (\d+)$", result.stdout,
                                                        re.MULTILINE)}


def steps(control: SchedulerControl) -> dict[int, int]:
    """rank -> the step it reported last (empty while the scheduler does not answer)."""
    status = control.status()
    return {} if status is None else {m["rank"]: m["step"] or 0 for m in status["members"]}


def kill_all(pids: dict[str, int]) -> None:
    for pid in pids.values():
        if not pid_gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_run_sh_starts_a_cluster_and_recover_sh_relaunches_the_scheduler_and_workers(
        tmp_path: Path, free_port: int) -> None:
    log_dir = tmp_path / "device"
    env = {**cluster_env(log_dir, free_port, worker_num=2, cooldown=1.0, heartbeat_timeout=2.0,
                         progress_timeout=60.0, cluster_time_out=60.0),
           "PYTHON": sys.executable}
    started: dict[str, int] = {}
    with ExitStack() as stack:
        stack.callback(kill_all, started)
        started.update(launch(RUN_SH, str(SCRIPT), "--rejoin", env=env, cwd=tmp_path))
        assert sorted(started) == ["scheduler", "worker 0", "worker 1"]
        wait_for_event(log_dir, 60, "generation 0", event="generation", generation=0)
        assert {e["node_id"]: e["pid"] for e in events(log_dir, "register")} == {
            "0": started["worker 0"], "1": started["worker 1"]}

        # The scheduler dies and is relaunched by hand: the workers re-attach, same pids,
        # and their steps go on.
        control = stack.enter_context(closing(SchedulerControl("127.0.0.1", free_port, "")))
        before = max(wait_for(lambda: steps(control), 60, "steps reported").values())
        os.kill(started["scheduler"], signal.SIGKILL)
        wait_for(lambda: pid_gone(started["scheduler"]), 10, "the scheduler gone")
        started.update(launch(RECOVER_SH, "sched", str(SCRIPT), env=env, cwd=tmp_path))
        wait_for_event(log_dir, 60, "a reloaded scheduler", event="scheduler_start",
                       reloaded=True, pid=started["scheduler"])
        for node_id in ("0", "1"):
            wait_for_event(log_dir, 30, f"worker {node_id} re-attached", event="attach",
                           pid=started[f"worker {node_id}"])
        wait_for(lambda: min(steps(control).values(), default=0) > before + 5, 60,
                 "steps advancing")
        assert len(events(log_dir, "register")) == 2  # nobody registered anew
        assert [e["generation"] for e in events(log_dir, "generation")] == [0]

        # A worker dies unseen: the scheduler hears no heartbeat and declares it dead; it
        # is relaunched by hand, refused until the cooldown is over, and forms generation 1
        # with the survivor, which waited for it (same pid).
        survivor = started["worker 0"]
        os.kill(started["worker 1"], signal.SIGKILL)
        verdict = wait_for_event(log_dir, 30, "worker 1 declared dead", event="verdict",
                                 node_id="1", verdict="heartbeat")
        started.update(launch(RECOVER_SH, "1", str(SCRIPT), "--rejoin", env=env, cwd=tmp_path))
        generation = wait_for_event(log_dir, 60, "generation 1", event="generation",
                                    generation=1)
        assert generation["ts"] >= verdict["ts"] + 1.0  # the cooldown
        assert {m["rank"]: m["pid"] for m in generation["members"]} == {
            0: survivor, 1: started["worker 1"]}
        wait_for(lambda: "rank 0 of 2 in generation 1" in (log_dir / "worker_0.log").read_text(),
                 30, "the survivor in generation 1")
        os.kill(survivor, signal.SIGUSR2)
        stop = wait_for_event(log_dir, 60, "the scheduler's end", event="scheduler_stop",
                              pid=started["scheduler"])
        assert (stop["exitcode"], stop["reason"]) == (0, "all 2 workers finished")
        assert "rank 0 finished at step" in (log_dir / "worker_0.log").read_text()
        assert "rank 1 finished at step" in (log_dir / "worker_1.log").read_text()
