"""The scheduler under tftrun: its kill -9 restarts no worker and the job finishes, even
when the workers finish while it is down."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from support import BIN, events, log_has, pid_gone, spawn, spawned_pids, terminate, tftrun_cmd, wait_for, wait_for_event
from support.mnist import WORKERS, final_digests, mnist_job
from support.sched_cluster import SCRIPT

pytestmark = pytest.mark.timeout(240)

FINALIZATION_GATE = BIN / "finalization_gate"
"""Holds a worker's interpreter in its finalization until a test lets it go."""


def test_kill_9_of_the_scheduler_under_tftrun_restarts_no_worker_and_the_job_finishes(
        tmp_path: Path, free_port: int) -> None:
    log_dir = tmp_path / "logs"
    tftrun = spawn(tftrun_cmd("--worker_num=2", f"--log_dir={log_dir}",
                              f"--master_port={free_port}",
                              f"--recovery_path={tmp_path / 'recovery'}",
                              str(SCRIPT), "--steps", "0"))  # until SIGUSR2: however
    # long the relaunched scheduler takes to start on a loaded host, training is still on
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
        os.kill(workers[0], signal.SIGUSR2)  # every worker finishes after the same step
        assert tftrun.wait(60) == 0, tftrun.stderr.read() if tftrun.stderr else ""
        spawned = [e for e in events(log_dir, "spawn") if e["role"] == "worker"]
        assert {e["rank"]: e["pid"] for e in spawned} == workers and len(spawned) == 2
        assert [e["what"] for e in events(log_dir, "restart")] == ["scheduler"]
        # Both schedulers forked warm by the fork server, on the socket it passed them.
        schedulers = [e for e in events(log_dir, "spawn") if e["role"] == "scheduler"]
        assert [e.get("forked") for e in schedulers] == [True, True]
        finished = {e["pid"] for e in events(log_dir, "leave") if e["state"] == "finished"}
        assert finished == set(workers.values())
    finally:
        terminate(tftrun)


def test_workers_that_finish_while_the_scheduler_is_down_exit_0_in_their_first_process(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    """The main job's workers finish between a kill -9 of the scheduler and its relaunch:
    each exits 0 in its first process, and the job ends as a fault-free one.

    The relaunched scheduler is held stopped (SIGSTOP: its port listens and nobody serves
    it, as while it imports torch) until every worker has exited or is finalizing its
    interpreter, where tests/bin/finalization_gate holds it until the scheduler is up. That
    is the moment the chaos test's kill_scheduler trial met by chance, when every worker
    aborted with "terminate called without an active exception".
    """
    log_dir, gate = tmp_path / "down", tmp_path / "gate"
    gate.mkdir()
    path = os.pathsep.join([str(FINALIZATION_GATE), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "FINALIZATION_GATE": str(gate), "PYTHONPATH": path}
    tftrun = spawn(mnist_job(tmp_path, "down", free_port), env=env)
    relaunched = None
    try:
        wait_for(lambda: tftrun.poll() is None and log_has(log_dir, 0, "step=50 "), 120,
                 "rank 0 at step 50 of 80")
        workers = list(spawned_pids(log_dir).values())
        os.kill(spawned_pids(log_dir, "scheduler")[None], signal.SIGKILL)
        relaunched = wait_for(lambda: [e["pid"] for e in events(log_dir, "spawn")
                                       if e["role"] == "scheduler"][1:], 60,
                              "the scheduler relaunched")[0]
        os.kill(relaunched, signal.SIGSTOP)
        assert len(events(log_dir, "scheduler_start")) == 1, "the relaunch was up before SIGSTOP"
        wait_for(lambda: all(pid_gone(pid) or (gate / f"{pid}.finalizing").exists()
                             for pid in workers), 30,
                 "every worker ended or finalizing while the scheduler is down")
        os.kill(relaunched, signal.SIGCONT)
        wait_for(lambda: all(pid_gone(pid) for pid in workers)
                 or events(log_dir, "scheduler_start")[1:], 60,
                 "the relaunched scheduler up, or every worker gone")
    finally:
        (gate / "go").touch()
        if relaunched is not None and not pid_gone(relaunched):
            os.kill(relaunched, signal.SIGCONT)
    try:
        stdout, stderr = tftrun.communicate(timeout=60)
        exits = sorted(((e["rank"], e.get("exitcode"), e.get("signal"))
                        for e in events(log_dir, "exit") if e["role"] == "worker"),
                       key=lambda exit: exit[0])
        assert exits == [(rank, 0, None) for rank in range(WORKERS)], \
            f"worker exits (rank, exitcode, signal): {exits}\n{stdout}{stderr}"
        assert tftrun.returncode == 0, stdout + stderr
        assert final_digests(log_dir) == mnist_reference
        for rank in range(WORKERS):
            assert not log_has(log_dir, rank, "terminate called"), f"worker_{rank}.log"
    finally:
        terminate(tftrun)
