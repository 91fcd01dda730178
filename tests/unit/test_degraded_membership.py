"""Degraded generations (``min_worker_num`` below ``worker_num``): the scheduler's rules."""

from __future__ import annotations

import pytest
from fake_clock import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st
from test_membership import TOKEN, accepted, ident, join_all

from recovery.control.membership import Membership
from recovery.timeouts import Timeouts


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
    clock = FakeClock()
    ms = make(worker_num, min_worker_num, clock)
    pids = {str(r): 100 + r for r in range(worker_num)}
    incarnations = dict.fromkeys(pids, 0)
    join_all(ms, pids)
    ms.drain_events()
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
