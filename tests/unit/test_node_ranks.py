"""Automatic node ranks: the assignment rule (property-tested), the scheduler's handling of
it (signed, persisted, reloaded) and which node takes itself for node 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.config import LaunchConfig, with_node_rank
from launcher.errors import ConfigError
from launcher.nodes.ranks import owns_address, place_node
from recovery.control.node_ranks import Given, NodeRanks, Refused
from support import events
from support.sched_inprocess import ask, reloaded, scheduler

NODE_IDS = st.sampled_from([f"host{n}/10.0.0.{n}" for n in range(6)])


@settings(max_examples=300, deadline=None)
@given(nnodes=st.integers(1, 5), nproc=st.integers(1, 3), arrivals=st.lists(NODE_IDS, max_size=12),
       reload_at=st.integers(0, 12))
def test_ranks_go_in_order_of_arrival_a_returning_node_keeps_its_own_and_a_surplus_one_is_refused(
        nnodes: int, nproc: int, arrivals: list[str], reload_at: int) -> None:
    ranks = NodeRanks()
    first_seen = list(dict.fromkeys(arrivals))  # node ids in the order they first came
    for at, node_id in enumerate(arrivals):
        if at == reload_at:  # a relaunched scheduler takes the persisted table back
            ranks = NodeRanks.parse(ranks.to_json())
        answer = ranks.assign(node_id, nproc, nnodes * nproc)
        order = first_seen.index(node_id)
        if order + 1 < nnodes:
            assert answer == Given(order + 1, returning=node_id in arrivals[:at])
        else:
            assert isinstance(answer, Refused) and answer.reason == "full"
            assert f"{nnodes} nodes" in answer.message and repr(node_id) in answer.message
        given_ranks = list(ranks.ranks.values())
        assert len(set(given_ranks)) == len(given_ranks)  # never two node ids with one rank
        assert all(1 <= rank < nnodes for rank in given_ranks)  # 0 is node 0's; < --nnodes


@given(nproc=st.integers(2, 5), worker_num=st.integers(1, 20))
def test_a_node_whose_workers_do_not_divide_the_job_is_refused(nproc: int, worker_num: int) -> None:
    answer = NodeRanks().assign("a", nproc, worker_num)
    assert isinstance(answer, Given) == (worker_num % nproc == 0 and worker_num // nproc > 1)
    if worker_num % nproc:
        assert answer == Refused("nproc", answer.message) and "--nproc_per_node" in answer.message


@pytest.mark.parametrize("table", [{"a": 2}, {"a": 1, "b": 1}, {"a": "x"}, {"a": 0}])
def test_a_malformed_persisted_table_is_refused(table: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        NodeRanks.parse(table)


def test_the_scheduler_answers_in_arrival_order_persists_and_a_relaunch_keeps_the_ranks(
        tmp_path: Path) -> None:
    sched = scheduler(tmp_path)  # 2 workers: with 1 per node, 2 nodes
    assert ask(sched, "node_rank", node_id="b", nproc=1) == {"ok": True, "node_rank": 1,
                                                              "signed": True}
    refused = ask(sched, "node_rank", node_id="c", nproc=1)
    assert (refused["ok"], refused["reason"], refused["signed"]) == (False, "full", True)
    again = reloaded(tmp_path)
    assert ask(again, "node_rank", node_id="b", nproc=1)["node_rank"] == 1
    assert ask(again, "node_rank", node_id="c", nproc=1)["reason"] == "full"
    assert [(e["node_id"], e["rank"], e["returning"])
            for e in events(tmp_path / "logs", "node_rank")] == [("b", 1, False), ("b", 1, True)]
    assert [e["node_id"] for e in events(tmp_path / "logs", "node_rank_refused")] == ["c", "c"]


def test_a_job_resumed_after_its_end_keeps_its_node_ranks(tmp_path: Path) -> None:
    ended = scheduler(tmp_path)
    ask(ended, "node_rank", node_id="b", nproc=1)
    ended._save(finished=True)  # an orderly end; --is_recover=1 then serves the same run id
    resumed = scheduler(tmp_path)
    assert not resumed._reload()  # no members, no generation: the job starts again
    assert ask(resumed, "node_rank", node_id="c", nproc=1)["reason"] == "full"
    assert ask(resumed, "node_rank", node_id="b", nproc=1)["node_rank"] == 1


def test_a_node_rank_asked_with_another_token_is_refused_unsigned(tmp_path: Path) -> None:
    sched = scheduler(tmp_path)
    refused = ask(sched, "node_rank", token="not-the-job-token", node_id="b", nproc=1)
    assert (refused["reason"], refused["signed"]) == ("token", False)
    assert sched.node_ranks.ranks == {}


@pytest.mark.parametrize(("master", "node", "owns"), [
    ("127.0.0.2", "127.0.0.2", True), ("127.0.0.2", "127.0.0.3", False),
    ("localhost", "127.0.0.1", True), ("no-such-host.invalid", "127.0.0.1", False)])
def test_node_0_is_the_node_whose_own_address_is_the_master(master: str, node: str,
                                                            owns: bool) -> None:
    assert owns_address(master, node) is owns


def job(tmp_path: Path, **fields: object) -> LaunchConfig:
    script = tmp_path / "train.py"
    script.write_text("")
    settings = {"worker_num": 4, "local_worker_num": 2, "node_rank": None,
                "master_addr": "127.0.0.2", "master_port": 29500, "log_dir": tmp_path / "logs",
                **fields}
    return LaunchConfig(script=script, **settings)  # type: ignore[arg-type]


def test_a_node_left_without_rank_is_node_0_only_at_the_masters_address(tmp_path: Path) -> None:
    assert place_node(job(tmp_path, node_addr="127.0.0.2")).node_rank == 0
    assert place_node(job(tmp_path, node_addr="127.0.0.3")).node_rank is None  # asks node 0
    alone = job(tmp_path, node_addr="127.0.0.3", local_worker_num=None)
    assert place_node(alone).node_rank == 0  # one node: there is no one else to ask
    given = job(tmp_path, node_addr="127.0.0.2", node_rank=1)
    assert place_node(given).node_rank == 1  # a rank given always wins


def test_an_assigned_rank_is_checked_as_a_given_one(tmp_path: Path) -> None:
    config = job(tmp_path, node_addr="127.0.0.3", nnodes=2)
    config.validate()  # the rank is not known yet: nothing to check
    assert with_node_rank(config, 1).first_rank == 2
    with pytest.raises(ConfigError, match="--node_rank=2 is not below --nnodes=2|does not fit"):
        with_node_rank(config, 2)
