"""Degraded generations (``min_worker_num`` below ``worker_num``): the scheduler's rules."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.control.membership import Membership
from recovery.timeouts import Timeouts
from support.fake_clock import FakeClock
from support.membership import TOKEN, accepted, ident, join_all


def make(worker_num: int, min_worker_num: int, clock: FakeClock | None = None) -> Membership:
    timeouts = Timeouts(rejoin_cooldown=30.0, cluster_time_out=600.0, heartbeat_timeout=5.0)
    return Membership(worker_num, TOKEN, timeouts, clock or FakeClock(), min_worker_num)


def membership_events(ms: Membership) -> list[dict[str, object]]:
    return [fields for name, fields in ms.drain_events() if name == "membership"]


def test_a_death_forms_a_generation_of_the_survivors_at_once_and_the_relaunch_grows_it_back() -> None:
    clock = FakeClock()
    ms = make(4, 3, clock)
    join_all(ms, {str(r): 100 + r for r in range(4)})
    assert membership_events(ms) == [{"active": [0, 1, 2, 3], "world": 4, "generation": 0,
                                      "why": "start", "lost": [], "joined": []}]
    ms.report_exit("2", 102, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    assert membership_events(ms) == [{"active": [0, 1, 3], "world": 3, "generation": 1,
                                      "why": "shrink", "lost": [2], "joined": []}]
    assert ms.active_ranks() == [0, 1, 3]
    assert accepted(ms.heartbeat(ident("0", 100), TOKEN, 5)).generation == 1
    clock.advance(30.0)
    assert accepted(ms.register(ident("2", 202, incarnation=1), TOKEN)).generation == 2
    assert membership_events(ms) == [{"active": [0, 1, 2, 3], "world": 4, "generation": 2,
                                      "why": "grow", "lost": [], "joined": [2]}]


def test_below_min_worker_num_no_generation_forms_until_enough_are_back() -> None:
    ms = make(4, 3)
    join_all(ms, {str(r): 100 + r for r in range(4)})
    ms.report_exit("1", 101, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    ms.report_exit("3", 103, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    events = membership_events(ms)
    assert [e["active"] for e in events] == [[0, 1, 2, 3], [0, 2, 3]]
    assert ms.generation == 1


def test_with_min_worker_num_equal_to_worker_num_a_death_forms_nothing() -> None:
    ms = make(3, 3)
    join_all(ms, {str(r): 100 + r for r in range(3)})
    ms.report_exit("1", 101, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    assert [e["why"] for e in membership_events(ms)] == ["start"]


def test_members_that_finish_or_are_stopped_do_not_shrink_the_generation() -> None:
    ms = make(3, 1)
    join_all(ms, {str(r): 100 + r for r in range(3)})
    ms.report_exit("0", 100, 0, abnormal=False, reason="done", by="worker", finished=True)
    ms.report_exit("1", 101, 0, abnormal=False, reason="stopped", by="supervisor")
    assert [e["why"] for e in membership_events(ms)] == ["start"]


def test_the_first_generation_waits_for_every_worker() -> None:
    ms = make(3, 1)
    join_all(ms, {"0": 100, "1": 101})
    assert ms.generation == -1 and membership_events(ms) == []


def test_a_min_worker_num_outside_the_job_is_refused() -> None:
    with pytest.raises(ValueError, match=r"min_worker_num must be in \[1, 2\], got 3"):
        make(2, 3)


def test_a_death_while_a_relaunched_rank_waits_to_join_shrinks_to_the_survivors() -> None:
    """Rank 2 is back but waits for the job to be whole (rank 1 is still missing) when
    rank 0 dies: the generation shrinks to the survivors of the formed one at once, and
    holds no dead member (it had kept rank 0, dead, found by Hypothesis)."""
    clock = FakeClock()
    ms = make(4, 1, clock)
    join_all(ms, {str(r): 100 + r for r in range(4)})
    ms.report_exit("1", 101, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    ms.report_exit("2", 102, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    clock.advance(30.0)
    accepted(ms.register(ident("2", 202, incarnation=1), TOKEN))
    ms.drain_events()
    ms.report_exit("0", 100, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    assert ms.active_ranks() == [3]
    assert [(e["why"], e["active"], e["lost"]) for e in membership_events(ms)] == [
        ("shrink", [3], [0])]


def formed(worker_num: int, min_worker_num: int) -> tuple[Membership, FakeClock,
                                                           dict[str, int], dict[str, int]]:
    """A membership whose first generation of every rank formed (its events drained); its
    clock, the ranks' pids and incarnations by node id."""
    clock = FakeClock()
    ms = make(worker_num, min_worker_num, clock)
    pids = {str(r): 100 + r for r in range(worker_num)}
    join_all(ms, pids)
    ms.drain_events()
    return ms, clock, pids, dict.fromkeys(pids, 0)


@settings(max_examples=200, deadline=None)
@given(worker_num=st.integers(2, 5), spare=st.integers(0, 4),
       deaths=st.lists(st.tuples(st.booleans(), st.integers(0, 4)), max_size=12))
def test_every_generation_has_at_least_min_worker_num_live_members(
        worker_num: int, spare: int, deaths: list[tuple[bool, int]]) -> None:
    """Ranks die and are relaunched after the cooldown in any order: every generation
    formed holds only live members, at least ``min_worker_num`` of them, and is
    announced by one ``membership`` event; a death leaving enough members shrinks the
    generation at once, and the job is whole again once every rank is back."""
    min_worker_num = max(1, worker_num - spare)
    ms, clock, pids, incarnations = formed(worker_num, min_worker_num)
    dead: set[str] = set()
    for relaunch, rank in deaths:
        before = {str(r) for r in ms.active_ranks()}
        node = str(rank % worker_num)
        if relaunch and node in dead:
            clock.advance(30.0)
            incarnations[node] += 1
            pids[node] += 1000
            accepted(ms.register(ident(node, pids[node], incarnations[node]), TOKEN))
            dead.discard(node)
        elif not relaunch and node not in dead:
            ms.report_exit(node, pids[node], incarnations[node], abnormal=True,
                           reason="SIGKILL", by="supervisor")
            dead.add(node)
        events = [fields for name, fields in ms.drain_events() if name in {"generation", "membership"}]
        for generation, membership in zip(events[::2], events[1::2]):
            assert membership["generation"] == generation["generation"]
            assert membership["world"] == len(membership["active"]) >= min_worker_num
            assert not {str(r) for r in membership["active"]} & dead
        live = set(pids) - dead
        if len(live) == worker_num or (min_worker_num <= len(live) and live <= before):
            assert {str(r) for r in ms.active_ranks()} == live  # shrunk at once, or whole


def test_a_relaunched_rank_that_registers_unready_joins_only_once_it_says_it_is_ready() -> None:
    """The others train on while it builds its model: the generation grows at its ready
    beat, not at its registration; a death meanwhile still shrinks the generation."""
    clock = FakeClock()
    ms = make(4, 2, clock)
    join_all(ms, {str(r): 100 + r for r in range(4)})
    ms.report_exit("1", 101, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    clock.advance(30.0)
    newcomer = ident("1", 201, incarnation=1)
    assert accepted(ms.register(newcomer, TOKEN, ready=False)).generation == 2
    assert [e["why"] for e in membership_events(ms)] == ["start", "shrink"]
    ms.report_exit("3", 103, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    assert [(e["why"], e["active"]) for e in membership_events(ms)] == [("shrink", [0, 2])]
    assert accepted(ms.heartbeat(newcomer, TOKEN, None, ready=False)).generation == 3
    assert membership_events(ms) == []
    assert accepted(ms.heartbeat(newcomer, TOKEN, None, ready=True)).generation == 2 + 1
    assert membership_events(ms) == []  # rank 3 is still missing: the job is not whole
    clock.advance(30.0)
    accepted(ms.register(ident("3", 203, incarnation=1), TOKEN))
    assert [(e["why"], e["active"]) for e in membership_events(ms)] == [("grow", [0, 1, 2, 3])]


def by_nodes(ms: Membership, nodes: int, per_node: int, incarnation: int = 0,
             ready: bool = True) -> None:
    """Register ``nodes`` nodes of ``per_node`` ranks, each through its supervisor (``nK``)."""
    for node in range(nodes):
        ms.heard_from_node(f"n{node}", per_node)
        for rank in range(node * per_node, (node + 1) * per_node):
            accepted(ms.register(ident(str(rank), 100 + rank + 1000 * incarnation, incarnation),
                                 TOKEN, ready=ready, via=f"n{node}"))


def test_a_lost_node_is_judged_at_once_its_ranks_retired_and_awaited_again_when_it_returns() -> None:
    """Node 1 (ranks 2, 3) stops beating: its ranks are judged together (one shrink, not
    one per rank: their last beats' ages differ), retired (no longer missing, nor keeping
    the job incomplete), and when the node returns its ranks grow the generation together."""
    clock = FakeClock()
    ms = make(4, 2, clock)
    by_nodes(ms, 2, 2)
    ms.drain_events()
    for lag in (0.0, 0.3):  # rank 3's last beat reached its supervisor 0.3 s before rank 2's
        clock.advance(1.0)
        ms.heard_from_node("n0", 2)
        ms.heard_from_node("n1", 2)
        for rank, sent in ((2, clock.time()), (3, clock.time() - lag)):
            ms.heartbeat(ident(str(rank), 100 + rank), TOKEN, 5, via="n1", sent=sent)
    for _ in range(60):  # node 0 beats on; node 1 is gone
        clock.advance(0.1)
        beat = [ms.heartbeat(ident(str(r), 100 + r), TOKEN, 6, via="n0") for r in (0, 1)]
        ms.heard_from_node("n0", 2)
        assert all(accepted(b) for b in beat)
        ms.check()
    assert [(e["why"], e["active"], e["lost"]) for e in membership_events(ms)] == [
        ("shrink", [0, 1], [2, 3])]
    assert ms.missing_ranks() == [2, 3] and ms.incomplete_for() > 0

    assert ms.retire([2, 3], "node 1 was not back") == [2, 3]
    assert ms.retire([3], "again") == []  # once
    assert membership_events(ms) == [{
        "active": [0, 1], "world": 2, "generation": 1, "why": "shrink", "lost": [],
        "joined": [], "retired": [2, 3], "reason": "node 1 was not back"}]
    assert ms.missing_ranks() == [] and ms.incomplete_for() == 0.0
    assert ms.status()["retired"] == [2, 3]

    clock.advance(30.0)  # the cooldown
    ms.heard_from_node("n1", 1)
    accepted(ms.register(ident("2", 202, incarnation=1), TOKEN, ready=False, via="n1"))
    assert ms.retired == set() and ms.missing_ranks() == [3]  # its node's ranks come back
    accepted(ms.heartbeat(ident("2", 202, incarnation=1), TOKEN, None, ready=True, via="n1"))
    assert membership_events(ms) == []  # rank 3 is awaited: no generation of 3
    accepted(ms.register(ident("3", 203, incarnation=1), TOKEN, via="n1"))
    assert [(e["why"], e["active"], e["joined"]) for e in membership_events(ms)] == [
        ("grow", [0, 1, 2, 3], [2, 3])]


def test_a_rank_back_already_or_before_the_first_generation_is_not_retired() -> None:
    clock = FakeClock()
    ms = make(3, 2, clock)
    join_all(ms, {"0": 100, "1": 101})
    assert ms.retire([2], "never came") == [] and ms.retired == set()
    accepted(ms.register(ident("2", 102), TOKEN))
    ms.report_exit("2", 102, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    clock.advance(30.0)
    accepted(ms.register(ident("2", 202, incarnation=1), TOKEN, ready=False))
    assert ms.retire([2, 7], "too late") == []  # registered again: back; 7 is no rank


def test_the_retired_ranks_are_persisted() -> None:
    clock = FakeClock()
    ms = make(3, 2, clock)
    join_all(ms, {str(r): 100 + r for r in range(3)})
    ms.report_exit("1", 101, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    ms.retire([1], "gone")
    again = make(3, 2, clock)
    assert again.load(json.loads(json.dumps(ms.to_json()))) is None
    assert again.retired == {1} and again.missing_ranks() == []


@settings(max_examples=200, deadline=None)
@given(worker_num=st.integers(2, 5), spare=st.integers(0, 4),
       moves=st.lists(st.tuples(st.sampled_from(["die", "retire", "return", "ready"]),
                                st.integers(0, 4)), max_size=14))
def test_retired_ranks_are_never_awaited_and_the_job_is_whole_without_them(
        worker_num: int, spare: int, moves: list[tuple[str, int]]) -> None:
    """Ranks die, are retired while dead and enough train, and return (unready, then
    ready) in any order:
    a retired rank is never missing; every generation holds only live, ready members, at
    least ``min_worker_num``; a rank that registers again is no longer retired; and once
    every rank not retired is live and ready, they are the generation, whatever is retired."""
    min_worker_num = max(1, worker_num - spare)
    ms, clock, pids, incarnations = formed(worker_num, min_worker_num)
    dead: set[int] = set()
    unready: set[int] = set()
    for move, drawn in moves:
        rank = drawn % worker_num
        node = str(rank)
        if move == "die" and rank not in dead:
            ms.report_exit(node, pids[node], incarnations[node], abnormal=True,
                           reason="SIGKILL", by="supervisor")
            dead.add(rank)
            unready.discard(rank)
        elif move == "retire" and rank in dead and worker_num - len(dead) >= min_worker_num:
            # as the supervisors do: only while enough ranks train
            expected = [] if rank in ms.retired else [rank]
            assert ms.retire([rank], "not back") == expected
        elif move == "return" and rank in dead:
            clock.advance(30.0)
            incarnations[node] += 1
            pids[node] += 1000
            accepted(ms.register(ident(node, pids[node], incarnations[node]), TOKEN,
                                 ready=False))
            dead.discard(rank)
            unready.add(rank)
            assert rank not in ms.retired
        elif move == "ready" and rank in unready:
            accepted(ms.heartbeat(ident(node, pids[node], incarnations[node]), TOKEN, None,
                                  ready=True))
            unready.discard(rank)
        for event in membership_events(ms):
            assert event["world"] == len(event["active"])
            if "retired" in event:  # no generation forms: the current one, less the retired
                assert not set(event["active"]) & set(event["retired"])
                continue
            assert event["world"] >= min_worker_num
            assert not set(event["active"]) & (dead | unready)
        assert ms.retired <= dead
        assert ms.missing_ranks() == sorted(dead - ms.retired)
        awaited = set(range(worker_num)) - ms.retired
        if not (dead - ms.retired):
            assert ms.incomplete_for() == 0.0
        if not awaited & (dead | unready):
            assert set(ms.active_ranks()) == awaited
