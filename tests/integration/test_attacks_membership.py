"""An elastic 2-node job (``--nnodes=1:2``) and beside it a process that holds no token
(tests/bin/attacker.py) and attacks who is a member (issue 38): it hides node 1's join
keys as fast as node 1 writes them, or replays two recorded beats of node 1 once node 1 is
dead. Node 0 neither closes a round without a node that joined nor keeps a dead node, and
an ``alert`` event names the key that was tampered with."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support import BIN, events, free_tcp_port, spawn, terminate, wait_for, wait_for_event
from support.attacker import attacker
from support.mnist import EVENT, START
from support.multinode import JOB_TOKEN, NODE_ADDRS, finish_ok, kill_node, log_dir, node_cmd

ELASTIC = "1:2"


def _start(tmp_path: Path, node: int, port: int, steps: int,
           *options: str) -> subprocess.Popen[str]:
    """Node ``node``'s tftrun of the elastic job, running plain_resumable.py for ``steps``."""
    ckpt = tmp_path / "plain_ckpt"
    ckpt.mkdir(exist_ok=True)
    return spawn(node_cmd(tmp_path, node, port, BIN / "plain_resumable.py", str(steps), str(ckpt),
                          options=options, nnodes=ELASTIC),
                 env={**os.environ, **JOB_TOKEN})


HIDDEN = "unset since this node wrote it"
BEAT_SAYS = "unset, while node 1's signed beat says it joined"


@pytest.mark.parametrize(("how", "reasons"), [("delete", {HIDDEN, BEAT_SAYS}),
                                              ("tamper", {HIDDEN, BEAT_SAYS, "not text"})])
def test_hidden_join_keys_exclude_no_node_and_raise_an_alert(tmp_path: Path, how: str,
                                                             reasons: set[str]) -> None:
    """With a 6 s last call, the stranger, on node 0's store as soon as it is up, hides
    node 1's join of the first round from node 0 from node 1's first write (a node 0 that
    believed its join keys alone closed the round without node 1 at the last call, unless
    it read one in the instant before the stranger hid it, and restarted the group for it
    later): the first generation has both nodes, and node 1's events name the hidden key
    (node 0's too, whenever it read the key hidden). Node 1, started first, waits for
    node 0's scheduler: it joins within a second of node 0's first round."""
    port = free_tcp_port()
    connected = tmp_path / "connected"
    last_call = "--rdzv_conf=last_call_timeout=6"
    procs: list[subprocess.Popen[str]] = []
    try:
        with attacker("hide_joins", NODE_ADDRS[0], port, 180, "1", str(connected), how):
            procs += [_start(tmp_path, node, port, 30, last_call) for node in (1, 0)][::-1]
            wait_for(connected.exists, START, "the stranger on node 0's store")
            first = wait_for_event(log_dir(tmp_path, 0), START, "the first generation",
                                   event="membership")
            assert first["nodes"] == [0, 1], first
            hidden = Path(f"{connected}.hidden")
            if hidden.exists() and float(hidden.read_text()) < first["ts"]:
                # Hidden before the round closed: a node's events name the key. (Node 0
                # may read the key in the instant before the stranger first hides it;
                # the round then closes at once, and there is nothing to alert.)
                alert = wait_for(lambda: _alert(tmp_path, "tft/round/0/join/1"), EVENT,
                                 "an alert on the join key")
                assert alert["reason"] in reasons, alert
        finish_ok(procs)
    finally:
        for proc in procs:
            terminate(proc)
    assert [e["nodes"] for e in events(log_dir(tmp_path, 0), "membership")] == [[0, 1]]


def _alert(tmp_path: Path, key: str) -> dict[str, object] | None:
    """The first ``alert`` naming ``key`` in either node's events, or None."""
    return next((e for node in (0, 1) for e in events(log_dir(tmp_path, node), "alert")
                 if e["key"] == key), None)


def test_replayed_beats_of_a_dead_node_keep_it_from_no_round(tmp_path: Path) -> None:
    """With a last call of 600 s, node 1 is killed while the stranger replays two of its
    recorded beats in turn: node 0 still finds it silent, closes the next round without it
    (a node 0 that took any change of the count for life waited the whole last call), and
    its events name the replayed key."""
    port = free_tcp_port()
    recorded = tmp_path / "recorded"
    options = ("--rdzv_conf=last_call_timeout=600",)
    procs = [_start(tmp_path, node, port, 400, *options) for node in (0, 1)]
    try:
        wait_for_event(log_dir(tmp_path, 0), START, "the first generation", event="membership")
        with attacker("replay_beats", NODE_ADDRS[0], port, 120, "1", str(recorded)):
            wait_for(recorded.exists, EVENT, "two beats of node 1 recorded")
            kill_node(tmp_path, procs, 1, 3)
            shrink = wait_for_event(log_dir(tmp_path, 0), EVENT, "node 0 alone",
                                    event="membership", why="shrink")
            assert shrink["nodes"] == [0], shrink
            alert = wait_for_event(log_dir(tmp_path, 0), EVENT, "an alert on node 1's beat",
                                   event="alert", key="tft/node/1/beat")
            assert "replay" in alert["reason"], alert
    finally:
        for proc in procs:
            terminate(proc)
