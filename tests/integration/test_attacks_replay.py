"""Replays across launches and jobs (issue 38): a network peer without the token
(tests/bin/store_replay.py) writes back what it recorded of a job's store, into the job's
next launch, or another job's identity into a job that a node is joining. Neither steers
a node: each launch signs with a key of its own, and a joining node asks node 0's
scheduler which job it serves."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recovery import env as names
from recovery.control.tcpstore_client import TCPStoreClient
from support import BIN, events, free_tcp_port, spawn, terminate, wait_for, wait_for_event
from support.mnist import EVENT, JOB, JOB_END, START, TRAIN
from support.multinode import JOB_TOKEN, NODE_LOSS, finish_ok, job_digests, kill_node, log_dir, node_cmd, nodes_running

PINNED = (*NODE_LOSS, "--node_time_out=5", "--min_worker_num=4")
"""Node 1's loss ends the job 5 s on; no degraded training: every round has 4 workers."""
NO_TOKEN = {k: v for k, v in os.environ.items() if k != names.TFT_JOB_TOKEN}


@contextmanager
def store_peer(mode: str, host: str, port: int, seconds: float, arg: str
               ) -> Iterator[subprocess.Popen[str]]:
    """tests/bin/store_replay.py at ``host:port``, without the token; stopped on the way out."""
    proc = spawn([sys.executable, str(BIN / "store_replay.py"), mode, host, str(port),
                  str(seconds), arg], env=NO_TOKEN)
    try:
        yield proc
    finally:
        terminate(proc, timeout=5)


def recorded_text(path: Path) -> str:
    """Every value the recording holds, as text."""
    recorded = json.loads(path.read_text())
    return "\n".join(base64.b64decode(value).decode(errors="replace")
                     for values in recorded.values() for value in values)


def test_a_recorded_first_launch_replayed_into_its_resumed_launch_stops_and_seats_no_node(
        tmp_path: Path, two_nodes_fault_free: dict[int, str]) -> None:  # noqa: F811
    """The first launch is recorded from its start to its end: node 1 is lost and node 0
    ends the job (``tft/end``). While the job is resumed with ``--is_recover=1`` (same run
    id), every recorded value is written back to its key, the old end among them: the
    resumed launch ends 0 on both nodes, bitwise equal to a fault-free run, as it would
    have without the replay."""
    port, recording = free_tcp_port(), tmp_path / "recorded.json"
    with nodes_running(tmp_path, port, TRAIN, *JOB, options=PINNED) as procs:
        wait_for_event(log_dir(tmp_path, 0), START, "node 0's scheduler", event="scheduler_start")
        with store_peer("record", "127.0.0.2", port, JOB_END, str(recording)) as recorder:
            kill_node(tmp_path, procs, 1, at_step=45)
            assert procs[0].wait(timeout=JOB_END) == 1
            recorder.wait(timeout=EVENT)
    [end] = events(log_dir(tmp_path, 0), "job_end")
    assert "did not come back" in end["reason"], end
    assert "did not come back" in recorded_text(recording)  # the old tft/end, signed
    with store_peer("replay", "127.0.0.2", port, JOB_END, str(recording)) as replayer:
        with nodes_running(tmp_path, port, TRAIN, *JOB,
                           options=(*PINNED, "--is_recover=1")) as procs:
            finish_ok(procs)
        assert replayer.poll() is None, "the replay ended before the resumed launch did"
    for node in (0, 1):
        ends = events(log_dir(tmp_path, node), "job_end")
        assert [e["reason"] for e in ends] == ["all workers succeeded"], ends
    starts = [events(log_dir(tmp_path, node), "job_start")[0]["run_id"] for node in (0, 1)]
    assert starts[0] == starts[1]
    assert job_digests(tmp_path) == two_nodes_fault_free


def test_another_jobs_identity_replayed_into_a_join_is_refused_and_the_node_joins_its_job(
        tmp_path: Path) -> None:
    """Job A, a scheduler of its own that shares the token, publishes its signed identity;
    a stranger keeps writing it into job B's store while B's node 1 joins. Node 1 says it
    refused that ``tft/job`` and joins B: B's run id, and both nodes end 0."""
    other_port, port = free_tcp_port(), free_tcp_port()
    other = spawn([sys.executable, "-m", "recovery.control.scheduler"], env={
        **os.environ, **JOB_TOKEN, names.MS_ROLE: names.ROLE_SCHEDULER,
        names.MS_SCHED_HOST: "127.0.0.5", names.MS_SCHED_PORT: str(other_port),
        names.MS_WORKER_NUM: "4", names.TFT_NODE_NUM: "2", names.TFT_LINEAGE: "another-lineage",
        names.TFT_RUN_ID: "another-job-same-token", names.TFT_LOG_DIR: str(tmp_path / "a_logs"),
        names.MS_RECOVERY_PATH: str(tmp_path / "a_recovery")})
    ckpt = tmp_path / "plain_ckpt"
    ckpt.mkdir()
    try:
        wait_for_event(tmp_path / "a_logs", START, "job A's scheduler", event="scheduler_start")
        node_0 = spawn(node_cmd(tmp_path, 0, port, BIN / "plain_resumable.py", "20", str(ckpt)),
                       env={**os.environ, **JOB_TOKEN})
        procs = [node_0]
        try:
            wait_for_event(log_dir(tmp_path, 0), START, "node 0's scheduler",
                           event="scheduler_start")
            with store_peer("copy", "127.0.0.2", port, JOB_END, f"127.0.0.5:{other_port}"):
                wait_for(lambda: b"another-job-same-token" in _job_value(port), EVENT,
                         "job A's identity in job B's store")
                procs.append(spawn(node_cmd(tmp_path, 1, port, BIN / "plain_resumable.py",
                                            "20", str(ckpt)), env={**os.environ, **JOB_TOKEN}))
                joined = wait_for_event(log_dir(tmp_path, 1), START, "node 1 starts",
                                        event="job_start")
                [started] = events(log_dir(tmp_path, 0), "job_start")
                assert joined["run_id"] == started["run_id"] != "another-job-same-token"
                outputs = finish_ok(procs)
        finally:
            for proc in procs:
                terminate(proc)
    finally:
        terminate(other)
    assert "refused the tft/job in node 0's store" in outputs[1], outputs[1]
    assert "another-job-same-token" in outputs[1]


def _job_value(port: int) -> bytes:
    """What job B's store holds under ``tft/job`` now."""
    client = TCPStoreClient("127.0.0.2", port, 5)
    try:
        return bytes(client.get("tft/job", 65_536)) if client.check(["tft/job"]) else b""
    finally:
        client.close()
