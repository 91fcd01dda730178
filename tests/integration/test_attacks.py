"""A real job, and beside it on loopback a process that holds no token and tries each
attack of issue 26 (tests/bin/attacker.py): plant a rendezvous, plant generation keys,
rewrite ``tft/job``, write garbage to every control key, announce a 4 GiB value, flood
the queue, replay a captured request into a second job that shares the token. Each
leaves the job unharmed: exit 0, bitwise equal to a fault-free run, no rank killed but
the one the test kills; the flood merely slows it, and the scheduler says so."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import ExitStack
from pathlib import Path

from recovery import env as names
from recovery.control.rpc import REQUESTS
from recovery.control.tcpstore_client import TCPStoreClient
from support import (
    BIN,
    TFT_OFF,
    events,
    free_tcp_port,
    log_has,
    signed_request,
    spawn,
    spawned_pids,
    terminate,
    wait_for,
    wait_for_event,
)
from support.attacker import attacker
from support.mnist import EVENT, START, assert_recovered, final_digests, mnist_job, wait_job
from support.multinode import finish_ok, log_dir, nodes_running

SHARED_TOKEN = {**TFT_OFF, "TFT_JOB_TOKEN": "f0e1d2c3b4a5968778695a4b3c2d1e0f"}


def test_planted_keys_and_announced_values_leave_a_recovering_job_unharmed(
        tmp_path: Path, mnist_reference: dict[int, str]) -> None:
    """While the attacker plants the next generations' keys, rewrites tft/job, garbles
    every control key and announces 4 GiB values, rank 1 is killed: it alone is
    relaunched, in a new generation, and the job ends bitwise equal to a fault-free one."""
    port = free_tcp_port()
    logs = tmp_path / "faulty"
    with ExitStack() as stack:
        proc = spawn(mnist_job(tmp_path, "faulty", port), env=SHARED_TOKEN)
        stack.callback(terminate, proc)
        wait_for_event(logs, START, "the scheduler serving", event="scheduler_start")
        stack.enter_context(attacker("keys", "127.0.0.1", port, 120))
        stack.enter_context(attacker("announce", "127.0.0.1", port, 120))
        wait_for(lambda: log_has(logs, 0, "step=30 "), START, "rank 0 past step 30")
        first = spawned_pids(logs)
        os.kill(first[1], signal.SIGKILL)
        [start] = events(logs, "job_start")
        replay_into_another_job(tmp_path, signed_request(
            SHARED_TOKEN["TFT_JOB_TOKEN"], "inject", run_id=start["run_id"], rank=0,
            fault="kill", at_step=1))
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(logs, first, [1], mnist_reference)
    assert not events(logs, "verdict") and not events(logs, "hang")


def replay_into_another_job(tmp_path: Path, captured: bytes) -> None:
    """A request signed for one job, as anyone who reaches its port can capture it (here
    an injection, made as the job's ``tftctl`` makes it, rather than popped from the
    live job's queue), pushed into the queue of a second job that shares the token:
    refused there, as a request whose signature does not verify, and nothing done."""
    port, logs = free_tcp_port(), tmp_path / "other_job"
    env = {**SHARED_TOKEN, names.MS_ROLE: names.ROLE_SCHEDULER,
           names.MS_SCHED_HOST: "127.0.0.1", names.MS_SCHED_PORT: str(port),
           names.MS_WORKER_NUM: "3", names.TFT_RUN_ID: "another-job-same-token",
           names.TFT_LOG_DIR: str(logs), names.MS_RECOVERY_PATH: str(tmp_path / "other_rec")}
    other = spawn([sys.executable, "-m", "recovery.control.scheduler"], env=env)
    try:
        wait_for_event(logs, START, "the second job's scheduler", event="scheduler_start")
        client = TCPStoreClient("127.0.0.1", port, 10)
        client.queue_push(REQUESTS, captured)
        refused = wait_for_event(logs, EVENT, "the replay refused", event="request_refused")
        assert refused["reason"] == "signature", refused
        assert not [e for e in events(logs) if e["event"] in ("register", "attach", "inject",
                                                              "leave", "last_words_claim")]
    finally:
        terminate(other)


def test_a_planted_rendezvous_misleads_no_node_of_a_restarting_job(tmp_path: Path) -> None:
    """The issue's measure: a 2-node restart-all job whose node 1 loses a rank once, and a
    stranger who sets tft/rendezvous/0..5 to a dead address (and the restart count, the
    job's end, tft/job to garbage) from the moment node 0's scheduler is up. Both nodes
    end 0, restarted once, with the same result as each other."""
    ckpt = tmp_path / "plain_ckpt"
    ckpt.mkdir()
    port = free_tcp_port()
    with nodes_running(tmp_path, port, BIN / "plain_resumable.py", "60", str(ckpt)) as procs:
        wait_for_event(log_dir(tmp_path, 0), START, "node 0's scheduler", event="scheduler_start")
        with attacker("keys", "127.0.0.2", port, 120):
            worker_2 = log_dir(tmp_path, 1) / "worker_2.log"
            wait_for(lambda: worker_2.exists() and "step=10\n" in worker_2.read_text(), START,
                     "rank 2 past step 10")
            os.kill(spawned_pids(log_dir(tmp_path, 1))[2], signal.SIGKILL)
            finish_ok(procs)
    values = set()
    for node in (0, 1):
        restarts = [e for e in events(log_dir(tmp_path, node), "restart")
                    if e["what"] == "workers"]
        assert [e["restart_count"] for e in restarts] == [1], restarts
        for rank in (2 * node, 2 * node + 1):
            text = (log_dir(tmp_path, node) / f"worker_{rank}.log").read_text()
            values |= {line for line in text.splitlines() if line.startswith("done value=")}
    assert len(values) == 1, values


def test_a_flood_of_junk_requests_slows_the_job_and_kills_no_rank(
        tmp_path: Path, mnist_reference: dict[int, str]) -> None:
    """40 s of junk pushed faster than the scheduler pops it, with --heartbeat_timeout=30:
    the members' beats wait behind it, so the scheduler, behind, judges nobody and says
    so; the job ends 0, bitwise equal to a fault-free run, no rank killed."""
    port = free_tcp_port()
    logs = tmp_path / "flooded"
    proc = spawn(mnist_job(tmp_path, "flooded", port, "--heartbeat_timeout=30"),
                 env=SHARED_TOKEN)
    try:
        wait_for_event(logs, EVENT, "generation 0", event="generation")
        with attacker("flood", "127.0.0.1", port, 40, "20000"):
            output = wait_job(proc)
    finally:
        terminate(proc)
    assert proc.returncode == 0, output
    assert final_digests(logs) == mnist_reference
    assert not events(logs, "verdict") and not events(logs, "hang")
    assert len([e for e in events(logs, "spawn") if e["role"] == "worker"]) == 3
    assert events(logs, "scheduler_behind"), "the flood never put the scheduler behind"
