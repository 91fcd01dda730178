"""The job's end reaches every node (docs/multi-node.md, *The job's end*).

Two tftruns on one host act as two nodes of 2 ranks each; the script uses ``recovery``
and trains degraded (tftrun's ``--min_worker_num``). Node 1's tftrun is killed with
``kill -9`` and started again; its ranks are refused (a long ``--rejoin_cooldown``), so
it waits for the scheduler on node 0 while node 0's ranks finish the job alone. Node 0
keeps its store up until node 1 has seen the end: node 1 exits 0 with one line, well
before its ``--node_time_out``, instead of waiting that long for a scheduler that is
gone and exiting 1.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from support import BIN, events, free_tcp_port, spawn, wait_for_event
from support.mnist import START, TRAIN
from support.multinode import JOB_TOKEN, kill_node, log_dir, node_cmd, nodes_running

pytestmark = pytest.mark.timeout(240)

NODE_TIME_OUT = 20
JOB = ("--epochs", "2", "--save_steps", "100000", "--synthetic_size", "12800",
       "--batch_size", "32", "--log_every", "10")
OPTIONS = ("--rejoin_cooldown=300", f"--node_time_out={NODE_TIME_OUT}")


def test_a_node_that_returns_to_a_job_that_ends_without_it_exits_0_at_once(tmp_path: Path) -> None:
    release = tmp_path / "release"
    script = (BIN / "paced.py", str(release), str(TRAIN), *JOB)
    port = free_tcp_port()
    with nodes_running(tmp_path, port, *script, options=OPTIONS, degraded=True) as procs:
        node_0 = log_dir(tmp_path, 0)
        kill_node(tmp_path, procs, 1, 20)
        wait_for_event(node_0, 60, "node 0's ranks alone", event="membership", why="shrink")
        procs[1] = spawn(node_cmd(tmp_path, 1, port, *script, options=OPTIONS, degraded=True),
                         env={**os.environ, **JOB_TOKEN})
        wait_for_event(node_0, START, "node 1's ranks refused", event="refuse", rank=2)
        release.touch()
        procs[0].communicate(timeout=START)
        node_0_ended = time.monotonic()
        out, err = procs[1].communicate(timeout=NODE_TIME_OUT + 60)
        node_1_ended = time.monotonic()
    assert procs[0].returncode == 0
    assert procs[1].returncode == 0, err[-3000:]
    assert node_1_ended - node_0_ended < NODE_TIME_OUT / 2, (node_1_ended - node_0_ended, err[-3000:])
    said = [line for line in err.splitlines() if "the job ended on node 0" in line]
    assert said == ["tftrun: the job ended on node 0 (exit 0: all workers succeeded): "
                    "node 1 has nothing left to run"], err[-3000:]
    assert [e["exitcode"] for e in events(log_dir(tmp_path, 1), "job_end")][-1:] == [0]
    assert "node beat failed" not in err and "not delivered" not in err, err[-3000:]
