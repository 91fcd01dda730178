"""What the nodes of one job share through node 0's store (recovery/control/nodes.py,
launcher/nodes/link.py), with a real in-process TCPStore; and the checks of a node's options."""

from __future__ import annotations

import itertools
import socket
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed import TCPStore

from launcher.config import LaunchConfig
from launcher.errors import ConfigError
from launcher.nodes import link as node_link
from launcher.nodes.link import (
    Beat,
    NodeKeys,
    NodeLink,
    NodeWatch,
    job_still_waited_for,
    local_address_towards,
    save_job,
)
from launcher.nodes.presence import BeatTracker
from launcher.procs.spec import Seat, worker_spec
from launcher.supervisor.actions import Stop
from launcher.supervisor.job_view import JobView, RankView
from launcher.supervisor.policy import decide
from launcher.supervisor.state import WorkerState
from recovery.ckpt import layout
from recovery.ckpt.lineage import join_lineage, read_lineage, record_lineage
from recovery.control import rpc
from recovery.control.files import StateFile
from recovery.control.nodes import (
    END_KEY,
    JOB_KEY,
    MAX_VALUE_BYTES,
    RESTART_KEY,
    JobIdentity,
    job_names,
    job_value,
    raise_counter,
    read_signed,
    rendezvous_key,
    stored_at,
)
from recovery.control.signing import job_key, sign_value
from recovery.control.tcpstore_client import TCPStoreClient

KEY = job_key("the-secret", "run-1", "")


_FRESH = itertools.count()


@pytest.fixture(scope="module")
def server() -> Any:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=5))


@pytest.fixture(scope="module")
def nodes(server: Any) -> list[TCPStoreClient]:
    """One store client per node."""
    return [TCPStoreClient("127.0.0.1", server.port, 5) for _ in range(5)]


@settings(max_examples=25, deadline=None)
@given(raises=st.lists(st.lists(st.integers(0, 6), max_size=5), min_size=1, max_size=4))
def test_nodes_raising_the_restart_count_at_once_agree_on_the_highest(
        server: Any, nodes: list[Any], raises: list[list[int]]) -> None:
    """Each inner list is one node raising the count, all nodes at once: the count ends
    at the highest value asked and was never lowered (each raise returns at least it)."""
    name = f"{RESTART_KEY}/{next(_FRESH)}"  # every example counts from nothing

    def node(index: int) -> list[int]:
        return [raise_counter(nodes[index], KEY, name, value) for value in raises[index]]

    with ThreadPoolExecutor(len(raises)) as pool:
        results = list(pool.map(node, range(len(raises))))
    for asked, got in zip(raises, results):
        assert all(g >= a for a, g in zip(asked, got))
        assert got == sorted(got)
    highest = max((v for r in raises for v in r), default=None)
    assert read_signed(nodes[4], KEY, name) == (None if highest is None else str(highest))


def test_a_node_takes_the_job_its_scheduler_published_and_its_rendezvous(server: Any) -> None:
    job = JobIdentity("run-1", "lineage1", 4, 2)
    for name in job_names("the-secret"):
        server.set(name, job_value("the-secret", job))
    with pytest.raises(ConfigError, match="TFT_JOB_TOKEN is not the one node 0"):
        NodeLink("127.0.0.1", server.port, "another-secret").wait_for_job(
            5, wrong_token_after=0.3)
    assert NodeLink("127.0.0.1", server.port, "the-secret").wait_for_job(5) == job
    link = NodeLink("127.0.0.1", server.port, "the-secret", "run-1")
    assert link.rendezvous(7, timeout=0.2) is None
    NodeLink("127.0.0.1", server.port, "the-secret", "run-1").publish_rendezvous(
        7, "127.0.0.2", 4242)
    assert link.rendezvous(7, timeout=1) == ("127.0.0.2", 4242)
    assert link.ended() is None
    link.end("node 1: rank 3 exited with code 1; restart budget (0) spent")
    assert "node 1" in (link.ended() or "")


@pytest.mark.parametrize("forged", ["unsigned", "another job's", "too long", "not a value"])
def test_a_value_that_is_not_the_jobs_reads_as_unset_and_is_reported(
        server: Any, forged: str) -> None:
    """Anyone may write node 0's store, and list its keys: a node neither follows nor
    crashes on a value the job did not sign (a stranger's, or another job's sharing the
    token), one too long to read, or garbage, even where the job keeps its values; it
    reports each key's refusals."""
    run = f"run-forged-{next(_FRESH)}"
    other = job_key("the-secret", "another-run", "")
    values = {"unsigned": lambda name, value: value,
              "another job's": lambda name, value: sign_value(other, name, value),
              "too long": lambda name, value: "x" * (MAX_VALUE_BYTES + 1),
              "not a value": lambda name, value: b"\xff\x00" * 40}[forged]
    for name, value in ((rendezvous_key(3), "10.9.9.9:1"), (RESTART_KEY, "9"),
                        (END_KEY, "a stranger says stop")):
        server.set(stored_at(job_key("the-secret", run, ""), name), values(name, value))
    for name in job_names("the-secret"):
        server.set(name, values(JOB_KEY, JobIdentity(run, "x", 4).to_json()))
    reported: list[tuple[str, str, int]] = []
    link = NodeLink("127.0.0.1", server.port, "the-secret", run,
                    report=lambda *refused: reported.append(refused))
    assert link.rendezvous(3, timeout=0.3) is None
    assert link.restarts_started() is None and link.ended() is None and link.reachable
    with pytest.raises(ConfigError, match="does not verify"):
        link.wait_for_job(5, wrong_token_after=0.3)
    assert {key for key, _why, _count in reported} == {rendezvous_key(3), RESTART_KEY,
                                                       END_KEY}
    link.restart_all(2)  # a stranger's count is replaced by the job's
    assert link.restarts_started() == 2
    for name in job_names("the-secret"):
        server.delete_key(name)


def test_a_node_whose_scheduler_never_comes_up_gives_up_with_one_line() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: nothing answers
        with pytest.raises(ConfigError, match="did not come up within --cluster_time_out=0.5s"):
            NodeLink("127.0.0.1", port, "the-secret").wait_for_job(0.5)


def test_the_node_address_is_the_interface_that_reaches_the_master() -> None:
    assert local_address_towards("127.0.0.1", 8118) == "127.0.0.1"
    with pytest.raises(ConfigError, match="give --node_addr"):
        local_address_towards("no-such-host.invalid", 8118)


def test_a_node_joins_node_0s_lineage_and_sets_an_earlier_jobs_state_aside(
        tmp_path: Path) -> None:
    record_lineage(tmp_path, "oldjob")
    (tmp_path / layout.CHECKPOINTS_DIR).mkdir()
    joined = join_lineage(tmp_path, "newjob")
    assert read_lineage(tmp_path) == "newjob" and joined.archived is not None
    assert (joined.archived / layout.CHECKPOINTS_DIR).is_dir()
    (tmp_path / layout.CHECKPOINTS_DIR).mkdir()
    again = join_lineage(tmp_path, "newjob")  # the node returns to its job: all kept
    assert again.archived is None and (tmp_path / layout.CHECKPOINTS_DIR).is_dir()


@pytest.mark.parametrize(("fields", "message"), [
    ({"nnodes": 2, "node_rank": 2, "worker_num": 6, "local_worker_num": 2},
     "--node_rank=2 is not below --nnodes=2"),
    ({"node_rank": -2, "worker_num": 4, "local_worker_num": 2},
     "--node_rank must be at least 0, or -1"),
    ({"nnodes": 2, "worker_num": 6, "local_worker_num": 2},
     "--worker_num=6 is not --nnodes=2 x --nproc_per_node=2"),
])
def test_node_options_that_do_not_fit_are_refused(tmp_path: Path, fields: dict[str, Any],
                                                  message: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    config = LaunchConfig(script=script, log_dir=tmp_path / "logs", **fields)
    with pytest.raises(ConfigError, match=message.replace("+", r"\+")):
        config.validate()


@settings(max_examples=100, deadline=None)
@given(bound=st.floats(0.5, 30), passes=st.lists(
    st.tuples(st.floats(0.0, 10.0), st.booleans()), max_size=30))
def test_a_node_is_declared_lost_only_after_an_unbroken_absence_of_the_bound(
        bound: float, passes: list[tuple[float, bool]]) -> None:
    """Each pass: the clock moves on, and the node is seen gone or back (NodeWatch dates
    the absence, the policy decides). The job ends exactly when the node has been gone,
    with no return in between, for ``bound`` s."""
    watch, now, missing_since = NodeWatch(), 0.0, None
    ranks = (RankView(0, WorkerState.RUNNING),)
    for step, gone in passes:
        now += step
        if not gone:
            missing_since = None
        elif missing_since is None:
            missing_since = now
        watch.seen("node 1" if gone else "", now)
        actions = decide(JobView(ranks, 0, missing=watch.missing, missing_since=watch.since,
                                 node_time_out=bound, node_rank=0), now)
        ends = [a for a in actions if isinstance(a, Stop)]
        expected = missing_since is not None and now - missing_since >= bound
        assert bool(ends) == expected
        assert not ends or ends[0] == Stop(
            1, f"node 0: node 1 did not come back within --node_time_out={bound:g}s",
            everywhere=True)


@settings(max_examples=60, deadline=None)
@given(age=st.integers(-5_000, 120_000).filter(lambda ms: ms not in (0, 60_000)).map(
    lambda ms: ms / 1000),  # whole ms, off the bounds: the clock's float rounding is not tested
    finished=st.booleans(), same_run=st.booleans())
def test_node_0_started_again_returns_only_to_a_job_the_other_nodes_still_wait_for(
        tmp_path_factory: pytest.TempPathFactory, age: float, finished: bool,
        same_run: bool) -> None:
    """Its usual command resumes the job when the scheduler's state is of the job it kept,
    unfinished, and younger than --node_time_out (the other nodes wait that long); any
    other state, an old crashed job's included, is a new job's start."""
    recovery = tmp_path_factory.mktemp("recovery")
    save_job(recovery, JobIdentity("run-1", "lineage1", 4))
    state = StateFile(recovery)
    state.save({"run_id": "run-1" if same_run else "run-0", "finished": finished})
    written = state.path.stat().st_mtime
    returned = job_still_waited_for(recovery, node_time_out=60.0, now=written + age)
    waited_for = same_run and not finished and 0 <= age <= 60.0
    assert returned == (JobIdentity("run-1", "lineage1", 4) if waited_for else None)


def test_node_0_without_a_kept_job_starts_a_new_one(tmp_path: Path) -> None:
    StateFile(tmp_path).save({"run_id": "run-1", "finished": False})
    assert job_still_waited_for(tmp_path, node_time_out=60.0, now=0.0) is None


def test_nodes_beat_and_meet_in_rounds_through_the_store(server: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 0 and node 2 join group restart 3 of an elastic job; node 0 closes it; node 1
    reads which nodes it runs on. A round's value that is not the job's reads as unset."""
    # A link skips what it cannot do within its timeouts (a store out of reach); on a
    # loaded test machine that must not drop a write this test then reads.
    monkeypatch.setattr(node_link, "TIMEOUT", 30.0)
    monkeypatch.setattr(rpc, "_PROBE_TIMEOUT", 30.0)
    node_0, node_1 = (NodeLink("127.0.0.1", server.port, "the-secret", "run-2")
                      for _ in range(2))
    assert node_0.round_nodes(3) is None and node_0.joined(3, range(3)) == NodeKeys({})
    node_1.join_round(3, 2)
    node_0.join_round(3, 0)
    assert set(node_0.joined(3, range(3)).found) == {0, 2}
    node_0.close_round(3, (0, 2))
    assert node_1.round_nodes(3) == (0, 2)
    node_0.close_round(4, ())  # the job ended well: no later round
    assert node_1.round_nodes(4) == ()
    server.set(stored_at(job_key("the-secret", "run-2", ""), "tft/round/5"), "0,1,2")
    assert node_1.round_nodes(5) is None
    node_1.beat(1, Beat(7))
    node_1.beat(2, Beat(8, joining=4))
    assert node_0.beats(range(1, 3)) == NodeKeys({1: Beat(7), 2: Beat(8, 4)})


def test_a_node_is_silent_since_its_last_changed_beat() -> None:
    tracker = BeatTracker(range(1, 3), started=10.0)
    assert tracker.silent_since(1) == 10.0 and not tracker.heard(1)
    tracker.seen(NodeKeys({1: Beat(4)}), now=11.0)
    tracker.seen(NodeKeys({1: Beat(4), 2: Beat(1)}), now=12.0)  # node 1 beat no more
    assert (tracker.silent_since(1), tracker.silent_since(2)) == (11.0, 12.0)
    assert tracker.heard(1) and tracker.heard(2)


def test_a_seat_gives_the_generations_ranks_and_keeps_the_slots_files(tmp_path: Path) -> None:
    config = LaunchConfig(script=Path("train.py"), worker_num=6, local_worker_num=2,
                          node_rank=2, nnodes=3, min_nnodes=1, log_dir=tmp_path)
    spec = worker_spec(config, 1, 0, 4, 1234, seat=Seat(2, 4, 1, 2))  # nodes 0 and 2
    env = spec.env
    assert (env["RANK"], env["WORLD_SIZE"], env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == (
        "3", "4", "1", "2")
    assert spec.rank == 5 and spec.log_path == tmp_path / "worker_5.log"
    fixed = worker_spec(config, 1, 0, 4, 1234).env
    assert (fixed["RANK"], fixed["WORLD_SIZE"], fixed["GROUP_RANK"]) == ("5", "6", "2")
