"""Training through a lost node (docs/elastic.md, *Across nodes*): two tftruns on one host
act as two nodes of 2 ranks each (tests/integration/test_multinode.py), the script uses
``recovery`` (templates/mnist/train.py with ``--log_params_hash``), ``--min_worker_num=2``.

Node 1's tftrun is killed with ``kill -9`` (its workers die with it): node 0's ranks train
on at W = 2 (one ``membership`` ``why: shrink``, both ranks ``lost``). Node 1's tftrun is
then started again with its command: its ranks register, heal from a live rank at a step
boundary, and the job grows back to 4 (``why: grow``, ``joined``), then ends 0 on both
nodes. Twice: started again within ``--rejoin_timeout``, and after it, once node 0 retired
its ranks (the ``membership`` event with ``retired``) and the scheduler awaits them no
more. ``--node_time_out`` is short (5 s): a job that still awaited a lost node's ranks
ended there (before, on every node: ``node 0: the ranks [2, 3] of another node did not
come back within --node_time_out=5s``). After every committed step every active rank
holds the same parameter hash, and each epoch trains a permutation of the data set.

The job is held at tests/bin/paced.py's pace (0.2 s a step) until the test saw it whole
again, so that it outlasts the scenario however loaded the host is; then it runs to its
end at full speed. The two jobs run side by side: most of each is waiting (its pace, a
beat, a timeout).
"""

from __future__ import annotations

import json
import os
import subprocess
from contextlib import ExitStack
from pathlib import Path

import pytest

from support import BIN, events, free_tcp_port, run, spawn, tftctl_cmd, wait_for_event
from support.degraded import committed_by_step, last_committers, trained_per_epoch
from support.mnist import EVENT, NARROW, START, TRAIN
from support.multinode import JOB_TOKEN, finish_ok, kill_node, log_dir, node_cmd, nodes_running

pytestmark = pytest.mark.timeout(300)

WORKERS, BATCH, SAMPLES, EPOCHS, KILL_STEP = 4, 32, 12800, 4, 20
"""100 steps an epoch; held at 0.2 s a step, the 400 steps outlast the scenario (about 40 s
from the first step to the grow at load 8; one was seen at 51 s)."""
REJOIN_TIMEOUT, NODE_TIME_OUT = 8, 5
"""A lost node's ranks are retired 8 s after its last beat; a job that awaited them
would end 5 s after node 0 found them missing, before."""
OPTIONS = ("--min_worker_num=2", "--rejoin_cooldown=2", f"--node_time_out={NODE_TIME_OUT}",
           "--heartbeat_timeout=3")
JOB = (*NARROW, "--epochs", str(EPOCHS), "--save_steps", "100000", "--synthetic_size", str(SAMPLES),
       "--batch_size", str(BATCH), "--log_every", "10", "--log_params_hash")


def scheduler_status(tmp_path: Path) -> dict[str, object]:
    done = run(tftctl_cmd("status", f"--log_dir={log_dir(tmp_path, 0)}", "--json"), timeout=60,
               env={**os.environ, **JOB_TOKEN})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class LostNode1:
    """One of the module's jobs: node 1 killed at step 20, then started again once node 0's
    ranks train alone (``retired``: once they also retired node 1's ranks)."""

    def __init__(self, tmp_path: Path, rejoin_timeout: int, retired: bool) -> None:
        self.tmp_path, self.retired = tmp_path, retired
        self.release = tmp_path / "release"
        self.script = (BIN / "paced.py", str(self.release), str(TRAIN), *JOB)
        self.options = (*OPTIONS, f"--rejoin_timeout={rejoin_timeout}")
        self.port = free_tcp_port()
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, stack: ExitStack) -> None:
        self.procs = stack.enter_context(nodes_running(self.tmp_path, self.port, *self.script,
                                                       options=self.options))

    def kill_node_1(self) -> None:
        kill_node(self.tmp_path, self.procs, 1, KILL_STEP)

    def start_node_1_again(self) -> None:
        node_0 = log_dir(self.tmp_path, 0)
        wait_for_event(node_0, EVENT, "node 0's ranks alone", event="membership",
                       why="shrink", active=[0, 1])
        if self.retired:
            wait_for_event(node_0, EVENT, "node 1's ranks retired", event="membership",
                           retired=[2, 3])
            status = scheduler_status(self.tmp_path)
            assert (status["missing"], status["retired"]) == ([], [2, 3]), status
        self.procs[1] = spawn(node_cmd(self.tmp_path, 1, self.port, *self.script, options=self.options),
                              env={**os.environ, **JOB_TOKEN})

    def release_once_whole(self) -> None:
        wait_for_event(log_dir(self.tmp_path, 0), START, "node 1's ranks back", event="membership",
                       why="grow")
        self.release.touch()


@pytest.fixture(scope="module")
def lost_nodes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The module's two jobs, run side by side (each mostly waits on its pace and its
    events), each in its folder: node 1 started again well within
    ``--rejoin_timeout=60`` (never retired), and after its ranks were retired."""
    back = LostNode1(tmp_path_factory.mktemp("node_back"), 60, retired=False)
    lost = LostNode1(tmp_path_factory.mktemp("node_lost"), REJOIN_TIMEOUT, retired=True)
    with ExitStack() as stack:
        for job in (back, lost):
            job.start(stack)
        for job in (back, lost):
            job.kill_node_1()
        for job in (back, lost):
            job.start_node_1_again()
        for job in (back, lost):
            job.release_once_whole()
        finish_ok([*back.procs, *lost.procs])
    return back.tmp_path, lost.tmp_path


@pytest.fixture(scope="module")
def node_back_in_time(lost_nodes: tuple[Path, Path]) -> Path:
    return lost_nodes[0]


@pytest.fixture(scope="module")
def node_lost_and_back(lost_nodes: tuple[Path, Path]) -> Path:
    return lost_nodes[1]


def changes(tmp_path: Path) -> list[tuple[object, ...]]:
    return [(e["why"], e["active"], e["world"], e.get("retired", []), e["lost"], e["joined"])
            for e in events(log_dir(tmp_path, 0), "membership")]


START_4 = ("start", [0, 1, 2, 3], 4, [], [], [])
SHRINK_2 = ("shrink", [0, 1], 2, [], [2, 3], [])
GROW_4 = ("grow", [0, 1, 2, 3], 4, [], [], [2, 3])


def test_node_0_trains_on_while_node_1_is_away_and_it_heals_when_started_again(
        node_back_in_time: Path) -> None:
    assert changes(node_back_in_time) == [START_4, SHRINK_2, GROW_4]
    assert_every_step_agreed_and_trained_once(node_back_in_time)


def test_node_0_retires_a_lost_nodes_ranks_and_takes_them_back_when_it_returns(
        node_lost_and_back: Path) -> None:
    assert changes(node_lost_and_back) == [
        START_4, SHRINK_2, ("shrink", [0, 1], 2, [2, 3], [], []), GROW_4]
    [retire] = [e for e in events(log_dir(node_lost_and_back, 0), "membership")
                if e.get("retired")]
    assert f"--rejoin_timeout={REJOIN_TIMEOUT}s" in retire["reason"], retire
    assert not events(log_dir(node_lost_and_back, 0), "cluster_timeout")
    assert_every_step_agreed_and_trained_once(node_lost_and_back)


def assert_every_step_agreed_and_trained_once(tmp_path: Path) -> None:
    """Every step committed once over both nodes' logs, by ranks that agree on the
    parameters, some at W = 2; each epoch a permutation of the data set; the job ended
    whole, every rank equal, with status 0 on both nodes."""
    by_step = committed_by_step(log_dir(tmp_path, 0), log_dir(tmp_path, 1))
    steps_per_epoch = SAMPLES // WORKERS // BATCH
    assert sorted(by_step) == list(range(1, EPOCHS * steps_per_epoch + 1))
    trained = trained_per_epoch(by_step, "constant", SAMPLES, BATCH, WORKERS)
    worlds = [last_committers(by_step, step)[0].world for step in sorted(by_step)]
    assert 2 in worlds, "no step was trained by node 0's ranks alone"
    assert worlds[-1] == WORKERS and worlds.index(2) > 0
    for epoch in range(1, EPOCHS + 1):
        assert sorted(trained[epoch]) == list(range(SAMPLES)), f"epoch {epoch}"
    ends = {e["rank"]: e["params_sha256"]
            for node in (0, 1) for e in events(log_dir(tmp_path, node), "train_end")}
    assert set(ends) == {0, 1, 2, 3} and len(set(ends.values())) == 1, ends
    for node in (0, 1):
        assert [e["exitcode"] for e in events(log_dir(tmp_path, node), "job_end")][-1:] == [0]
