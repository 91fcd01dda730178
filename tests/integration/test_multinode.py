"""Many nodes on one machine: each "node" is its own tftrun, with its own working folder
(log dir, recovery path) and its own loopback address (Linux routes all of 127/8 to lo).

The nodes share nothing but the network and the job token, which whoever starts them
gives each (TFT_JOB_TOKEN): node 1 learns the job (run id, lineage) and each restart's
rendezvous from node 0's scheduler.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from support import BIN, TFT_OFF, events, free_tcp_port, run, spawn, spawned_pids, terminate, wait_for, wait_for_event
from support.mnist import EVENT, JOB, JOB_END, START, TRAIN, final_digests, worker_launches
from support.multinode import (
    JOB_TOKEN,
    NODE_LOSS,
    finish_ok,
    job_digests,
    kill_node,
    kill_node_and_start_it_again,
    log_dir,
    node_cmd,
    nodes_running,
)


def test_a_node_started_without_the_shared_token_is_refused_with_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TFT_JOB_TOKEN"}
    refused = run(node_cmd(tmp_path, 1, free_tcp_port(), TRAIN, *JOB), timeout=60, env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "TFT_JOB_TOKEN" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_a_node_given_another_token_than_node_0_is_refused_with_one_line(tmp_path: Path) -> None:
    port = free_tcp_port()
    node_0 = spawn(node_cmd(tmp_path, 0, port, TRAIN, *JOB), env={**os.environ, **JOB_TOKEN})
    try:
        other = run(node_cmd(tmp_path, 1, port, TRAIN, *JOB), timeout=60,
                    env={**os.environ, "TFT_JOB_TOKEN": "not-the-secret-node-0-was-given"})
    finally:
        terminate(node_0)
    assert other.returncode == 2, other.stdout + other.stderr
    assert "TFT_JOB_TOKEN" in other.stderr and len(other.stderr.strip().splitlines()) == 1
    assert not (log_dir(tmp_path, 1) / "worker_2.log").exists()  # refused before any worker


def test_two_nodes_of_two_ranks_end_bitwise_equal_to_one_node_of_four(
        tmp_path: Path, two_nodes_fault_free: dict[int, str]) -> None:
    from support import tftrun_cmd

    one_node = run(tftrun_cmd("--worker_num=4", f"--log_dir={tmp_path / 'one'}",
                              f"--recovery_path={tmp_path / 'one_recovery'}",
                              f"--master_port={free_tcp_port()}", str(TRAIN), *JOB),
                   timeout=JOB_END, env=TFT_OFF)
    assert one_node.returncode == 0, one_node.stdout + one_node.stderr
    assert sorted(two_nodes_fault_free) == [0, 1, 2, 3]
    assert two_nodes_fault_free == final_digests(tmp_path / "one")


def test_a_rank_killed_on_node_1_is_relaunched_alone_and_takes_a_replica(
        tmp_path: Path, two_nodes_fault_free: dict[int, str]) -> None:
    from launcher.cli import tftctl as ctl

    with nodes_running(tmp_path, free_tcp_port(), TRAIN, *JOB,
                       env={**os.environ, "MS_ENABLE_TFT": "{ARF:1}"}) as procs:
        wait_for_event(log_dir(tmp_path, 0), START, "node 0's scheduler up", event="scheduler_start")
        # Through node 0's scheduler, as tftctl on node 0 would: rank 3 runs on node 1.
        assert ctl.main(["inject", f"--log_dir={log_dir(tmp_path, 0)}", "--rank=3",
                         "--fault=kill", "--at_step=40"]) == 0
        finish_ok(procs)
    assert [r for r, _ in worker_launches(log_dir(tmp_path, 0))] == [0, 1]
    assert [r for r, _ in worker_launches(log_dir(tmp_path, 1))] == [2, 3, 3]
    rollbacks = events(log_dir(tmp_path, 0), "rollback")
    assert rollbacks and all(r["source"] == "replica" for r in rollbacks), rollbacks
    assert job_digests(tmp_path) == two_nodes_fault_free


@pytest.fixture(scope="module")
def plain_job_killed_on_node_1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain script (it never registers with the scheduler) on two nodes with
    ``--node_time_out=2``, rank 2 killed on node 1 past step 10; its folder."""
    tmp_path = tmp_path_factory.mktemp("plain_killed")
    # The script's own checkpoint is the user's business: a folder both nodes see here.
    ckpt = tmp_path / "plain_ckpt"
    ckpt.mkdir()
    with nodes_running(tmp_path, free_tcp_port(), BIN / "plain_resumable.py", "60",
                       str(ckpt), options=("--node_time_out=2",)) as procs:
        worker_2 = log_dir(tmp_path, 1) / "worker_2.log"
        wait_for(lambda: worker_2.exists() and "step=10\n" in worker_2.read_text(), START,
                 "rank 2 past step 10")
        os.kill(spawned_pids(log_dir(tmp_path, 1))[2], signal.SIGKILL)
        finish_ok(procs)
    return tmp_path


def test_a_plain_script_killed_on_node_1_restarts_on_both_nodes_and_resumes(
        plain_job_killed_on_node_1: Path) -> None:
    tmp_path = plain_job_killed_on_node_1
    for node in (0, 1):
        restarts = [e for e in events(log_dir(tmp_path, node), "restart") if e["what"] == "workers"]
        assert [e["restart_count"] for e in restarts] == [1], restarts
        for rank in (2 * node, 2 * node + 1):
            text = (log_dir(tmp_path, node) / f"worker_{rank}.log").read_text()
            assert "resumed from step=" in text and "done value=" in text, text[-2000:]


def test_node_1_killed_and_started_again_rejoins_and_node_0_never_restarts(
        tmp_path: Path, two_nodes_fault_free: dict[int, str]) -> None:
    """With automatic node ranks: node 1, started first, gets rank 1 from node 0; a third
    node is one too many; node 1 started again is known and gets rank 1 again."""
    port = free_tcp_port()
    with nodes_running(tmp_path, port, TRAIN, *JOB, options=NODE_LOSS, auto_rank=True) as procs:
        given = wait_for_event(log_dir(tmp_path, 0), EVENT, "node 1 given its rank",
                               event="node_rank")
        surplus = run(node_cmd(tmp_path, 2, port, TRAIN, *JOB, auto_rank=True), timeout=60,
                      env={**os.environ, **JOB_TOKEN})
        assert surplus.returncode == 2, surplus.stdout + surplus.stderr
        [line] = surplus.stderr.strip().splitlines()
        assert "no node rank" in line and "2 nodes all have their ranks" in line, line
        kill_node_and_start_it_again(tmp_path, procs, 1, port, 30, auto_rank=True)
        outputs = finish_ok(procs)
    assert [r for r, _ in worker_launches(log_dir(tmp_path, 0))] == [0, 1]
    assert [r for r, _ in worker_launches(log_dir(tmp_path, 1))] == [2, 3]
    assert "tftrun: node rank 1 from node 0's scheduler" in outputs[1]
    ranks = events(log_dir(tmp_path, 0), "node_rank")
    assert [(e["node_id"], e["rank"], e["returning"]) for e in ranks] == [
        (given["node_id"], 1, False), (given["node_id"], 1, True)]
    assert given["node_id"].endswith("/127.0.0.3")
    assert job_digests(tmp_path) == two_nodes_fault_free


def test_node_0_killed_and_started_again_resumes_its_scheduler_and_node_1_never_restarts(
        tmp_path: Path, two_nodes_fault_free: dict[int, str]) -> None:
    port = free_tcp_port()
    with nodes_running(tmp_path, port, TRAIN, *JOB, options=NODE_LOSS) as procs:
        kill_node_and_start_it_again(tmp_path, procs, 0, port, 30)  # its usual command
        outputs = finish_ok(procs)
    assert [r for r, _ in worker_launches(log_dir(tmp_path, 1))] == [2, 3]
    [start] = events(log_dir(tmp_path, 0), "scheduler_start")  # this log dir's run: the second
    assert start["reloaded"] is True
    assert "node 0 returns to job" in outputs[0]
    assert job_digests(tmp_path) == two_nodes_fault_free


def test_a_plain_script_on_two_nodes_outlives_node_time_out(plain_job_killed_on_node_1: Path) -> None:
    """Its ranks never register with the scheduler: node 0 knows node 1 is there by its
    tftrun's beats, not by the ranks (it used to end the job after --node_time_out),
    its group restart included."""
    for node in (0, 1):
        assert [e["reason"] for e in events(log_dir(plain_job_killed_on_node_1, node), "job_end")] == [
            "all workers succeeded"]


def _worlds(log: Path) -> list[int]:
    """The WORLD_SIZE of each launch a plain_resumable.py worker log shows."""
    return [int(world) for world in re.findall(r"^world=(\d+) ", log.read_text(), re.M)]


def test_an_elastic_plain_job_shrinks_without_a_lost_node_and_grows_when_it_returns(
        tmp_path: Path) -> None:
    """--nnodes=1:2: node 1's tftrun killed, node 0's workers restart alone at WORLD_SIZE
    2 from the script's checkpoint; node 1 started again, every worker restarts at 4."""
    ckpt = tmp_path / "plain_ckpt"
    ckpt.mkdir()
    port = free_tcp_port()
    script = (BIN / "plain_resumable.py", "200", str(ckpt))
    # With the default last call (30 s): the first round closes once both nodes joined
    # (MAX), the next once node 1 is silent (3 s), the last once it joined again.
    with nodes_running(tmp_path, port, *script, nnodes="1:2") as procs:
        kill_node(tmp_path, procs, 1, 3)
        wait_for_event(log_dir(tmp_path, 0), EVENT, "node 0 alone", event="membership",
                       why="shrink")
        worker_0 = log_dir(tmp_path, 0) / "worker_0.log"
        # A restart's workers import torch before they print: a wait for a start.
        wait_for(lambda: _worlds(worker_0)[-1:] == [2], START, "node 0's workers at 2")
        procs[1] = spawn(node_cmd(tmp_path, 1, port, *script, nnodes="1:2"),
                         env={**os.environ, **JOB_TOKEN})
        finish_ok(procs)
    changes = events(log_dir(tmp_path, 0), "membership")
    assert [(e["why"], e["nodes"], e["world"], e["active"]) for e in changes] == [
        ("start", [0, 1], 4, [0, 1, 2, 3]), ("shrink", [0], 2, [0, 1]),
        ("grow", [0, 1], 4, [0, 1, 2, 3])]
    generations = [e["generation"] for e in changes]
    assert generations == sorted(set(generations)), generations
    assert _worlds(worker_0) == [4, 2, 4]
    returned = (log_dir(tmp_path, 1) / "worker_2.log").read_text()
    assert _worlds(log_dir(tmp_path, 1) / "worker_2.log") == [4]
    assert "world=4 rank=2" in returned and "resumed from step=" in returned
    for node in (0, 1):  # every launch after the first resumed from the script's checkpoint
        text = (log_dir(tmp_path, node) / f"worker_{2 * node}.log").read_text()
        assert "done value=" in text, text[-2000:]
    assert worker_0.read_text().count("resumed from step=") == 2
