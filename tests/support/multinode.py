"""Many nodes on one machine: each "node" is its own tftrun with its own working folder
and loopback address; helpers to start, kill and finish them."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support import pid_gone, spawn, spawned_pids, terminate, tftrun_cmd, wait_for
from support.mnist import EVENT, JOB, JOB_END, START, TRAIN, final_digests

NODE_ADDRS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
JOB_TOKEN = {"TFT_JOB_TOKEN": "the-secret-every-node-is-given"}
PER_NODE = 2


def node_cmd(tmp_path: Path, node: int, port: int, script: Path, *script_args: str,
             options: tuple[str, ...] = (), auto_rank: bool = False,
             nnodes: str = "2", degraded: bool = False) -> list[str]:
    """tftrun for node ``node`` of a 2-node x 2-rank job (``--nnodes``: ``nnodes``); its
    files under tmp_path/node<K>. ``auto_rank``: no node rank given (node 0 leaves the
    flag out, the others give msrun's ``--node_rank=-1``): node 0 is the node at the
    master's address, the others ask it. ``degraded``: tftrun's own ``--min_worker_num``
    (see :func:`support.tftrun_cmd`)."""
    home = tmp_path / f"node{node}"
    rank = f"--node_rank={-1 if auto_rank else node}"
    return tftrun_cmd(
        f"--nnodes={nnodes}", f"--nproc_per_node={PER_NODE}", *([] if auto_rank and node == 0 else [rank]),
        f"--master_addr={NODE_ADDRS[0]}", f"--master_port={port}",
        f"--node_addr={NODE_ADDRS[node]}", f"--log_dir={home / 'logs'}",
        f"--recovery_path={home / 'recovery'}", "--rejoin_cooldown=0",
        "--cluster_time_out=60", "--grace_period=5", *options, str(script), *script_args,
        degraded=degraded)


def start_nodes(tmp_path: Path, port: int, script: Path, *script_args: str,
                options: tuple[str, ...] = (), env: dict[str, str] | None = None,
                auto_rank: bool = False, nnodes: str = "2",
                degraded: bool = False) -> list[subprocess.Popen[str]]:
    """Node 1 first, then node 0: the nodes may start in any order."""
    started = [spawn(node_cmd(tmp_path, node, port, script, *script_args, options=options,
                              auto_rank=auto_rank, nnodes=nnodes, degraded=degraded),
                     env={**(env or os.environ), **JOB_TOKEN}) for node in (1, 0)]
    return started[::-1]


@contextmanager
def nodes_running(tmp_path: Path, port: int, script: Path, *script_args: str,
                  options: tuple[str, ...] = (), env: dict[str, str] | None = None,
                  auto_rank: bool = False, nnodes: str = "2", degraded: bool = False
                  ) -> Iterator[list[subprocess.Popen[str]]]:
    """Both nodes' tftrun, stopped on the way out whatever happened (a node the test
    replaced in the list included)."""
    procs = start_nodes(tmp_path, port, script, *script_args, options=options, env=env,
                        auto_rank=auto_rank, nnodes=nnodes, degraded=degraded)
    try:
        yield procs
    finally:
        for proc in procs:
            terminate(proc)


def log_dir(tmp_path: Path, node: int) -> Path:
    return tmp_path / f"node{node}" / "logs"


def finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    """Wait for every node's tftrun; (status, output) of each. Stops them all on a timeout."""
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=JOB_END)
            results.append((proc.returncode, out + err))
    finally:
        for proc in procs:
            terminate(proc)
    return results


def finish_ok(procs: list[subprocess.Popen[str]]) -> list[str]:
    """Wait for every node's tftrun and check that each ended with status 0; their output."""
    results = finish(procs)
    for status, output in results:
        assert status == 0, output
    return [output for _, output in results]


def job_digests(tmp_path: Path) -> dict[int, str]:
    return {**final_digests(log_dir(tmp_path, 0)), **final_digests(log_dir(tmp_path, 1))}



NODE_LOSS = ("--heartbeat_timeout=5",)
"""Options of a node that is killed and started again: its ranks are judged lost soon."""


def kill_node(tmp_path: Path, procs: list[subprocess.Popen[str]], node: int,
              at_step: int) -> None:
    """``kill -9`` node ``node``'s tftrun once its first rank passed ``at_step``; wait for
    its workers to die with it."""
    first = log_dir(tmp_path, node) / f"worker_{node * PER_NODE}.log"
    wait_for(lambda: first.exists() and re.search(rf"step={at_step}\b", first.read_text()),
             START, f"node {node} past step {at_step}")
    workers = spawned_pids(log_dir(tmp_path, node))
    procs[node].kill()
    procs[node].wait()
    wait_for(lambda: all(pid_gone(pid) for pid in workers.values()), EVENT,
             f"node {node}'s workers gone with its tftrun")


def kill_node_and_start_it_again(tmp_path: Path, procs: list[subprocess.Popen[str]], node: int,
                                 port: int, at_step: int, *again: str,
                                 auto_rank: bool = False) -> None:
    """:func:`kill_node`, then start its tftrun again with the same command."""
    kill_node(tmp_path, procs, node, at_step)
    procs[node] = spawn(node_cmd(tmp_path, node, port, TRAIN, *JOB, options=(*NODE_LOSS, *again),
                                 auto_rank=auto_rank),
                        env={**os.environ, **JOB_TOKEN})
