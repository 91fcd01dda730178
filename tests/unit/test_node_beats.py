"""Beats per node: a supervisor's batching and fan-out (recovery/control/node_beats.py) and
the scheduler's judgement of a node's silence (recovery/control/membership.py), exactly,
on a fake clock; and one node beat through the real scheduler's request handling."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.control.members import Identity, MemberState
from recovery.control.membership import Membership
from recovery.control.node_beats import BEAT_BYTES, NodeBeats
from recovery.control.requests import MAX_REQUEST_BYTES, NODE_BEAT_RANKS
from recovery.timeouts import Timeouts
from support.fake_clock import FakeClock
from support.sched_inprocess import TOKEN, ask, scheduler

TIMEOUT = 30.0
INTERVAL = 6.0


def report(rank: int, **fields: Any) -> dict[str, Any]:
    return {"node_id": str(rank), "pid": 100 + rank, "incarnation": 1, "host": "h",
            "rank": rank, **fields}


def accepted(rank: int, generation: int = 0, **extra: Any) -> dict[str, Any]:
    return {"ok": True, "node_id": str(rank), "rank": rank, "generation": generation,
            "fault_at": None, **extra}


def registered(ranks: int, now: float = 0.0) -> NodeBeats:
    """A node whose ``ranks`` ranks registered through one beat and were accepted."""
    beats = NodeBeats(TIMEOUT, INTERVAL)
    for rank in range(ranks):
        beats.heard(rank, "register", report(rank), now)
    for sent in beats.beats(now):
        beats.fan_out(sent, {"ok": True, "ranks": [accepted(key) for key, _e in sent]})
    return beats


def test_a_rank_that_becomes_ready_is_beaten_for_at_once_and_the_scheduler_hears_it() -> None:
    """Degraded training's deferred join: a relaunched rank registers unready and says
    when it is ready; the job is whole again only once the scheduler hears so."""
    beats = NodeBeats(TIMEOUT, INTERVAL)
    beats.heard(0, "register", report(0, ready=False), 0.0)
    [sent] = beats.beats(0.0)
    assert sent[0][1]["ready"] is False
    beats.fan_out(sent, {"ok": True, "ranks": [accepted(0)]})
    # What heard() returns wakes the beat thread (launcher/supervisor/beats.py), which
    # otherwise sleeps until the beat it planned: an interval on, seconds of a rejoin.
    assert beats.heard(0, "heartbeat", report(0, step=None, ready=False), 1.0) is False
    assert beats.next_due() == INTERVAL  # nothing new: the usual spacing
    assert beats.heard(0, "heartbeat", report(0, step=None, ready=True), 2.0) is True
    assert beats.next_due() == -math.inf
    [sent] = beats.beats(2.0)
    assert (sent[0][1]["op"], sent[0][1]["ready"]) == ("heartbeat", True)
    assert beats.next_due() > 2.0


def test_an_urgent_step_time_summary_is_beaten_at_once_and_alone() -> None:
    """A rank's urgent summary (recovery/control/stragglers.py StepTimes: a slow-down)
    replaces the faster steps it sent since the node's last beat, which would outweigh it
    in a merged median, and goes out at once."""
    beats = registered(1)
    assert beats.heard(0, "heartbeat", report(0, step=50, step_us=1000, steps=50), 1.0) is False
    assert beats.heard(0, "heartbeat", report(0, step=70, step_us=3000, steps=20, urgent=True),
                       1.5) is True
    assert beats.next_due() == -math.inf
    [sent] = beats.beats(1.5)
    assert (sent[0][1]["step_us"], sent[0][1]["steps"]) == (3000, 20)
    assert beats.heard(0, "heartbeat", report(0, step=80, step_us=3000, steps=10), 2.0) is False


def test_registrations_go_out_at_once_and_once_and_each_rank_gets_its_own_answer() -> None:
    beats = NodeBeats(TIMEOUT, INTERVAL)
    beats.heard(7, "register", report(0), 0.0)
    beats.heard(9, "register", report(1), 0.0)
    assert beats.next_due() == -math.inf
    [sent] = beats.beats(0.0)
    assert [(key, entry["op"], entry["rank"]) for key, entry in sent] == [
        (7, "register", 0), (9, "register", 1)]
    answers = beats.fan_out(sent, {"ok": True, "ranks": [
        accepted(0, inject=[{"id": "i1"}]), {"ok": False, "reason": "cooldown"}]})
    assert answers == {7: accepted(0, inject=[{"id": "i1"}]), 9: {"ok": False, "reason": "cooldown"}}
    assert beats.next_due() == INTERVAL  # nothing waits: the next beat an interval on
    [again] = beats.beats(INTERVAL)
    assert [(key, entry["op"]) for key, entry in again] == [(7, "heartbeat")]  # the refused one asks anew


def test_a_beat_carries_each_ranks_step_phase_and_age_and_hands_injections_out_once() -> None:
    beats = registered(2)
    beats.heard(0, "heartbeat", report(0, step=12, phase="train"), 4.0)
    beats.heard(1, "heartbeat", report(1, step=11, phase="save"), 5.5)
    [sent] = beats.beats(6.0)
    assert [(e["step"], e["phase"], e["age"]) for _k, e in sent] == [(12, "train", 2000),
                                                                      (11, "save", 500)]
    news = beats.news
    beats.fan_out(sent, {"ok": True, "ranks": [accepted(0), accepted(1, inject=[{"id": "x"}])]})
    assert beats.news == news + 1  # rank 1 has something new; rank 0 nothing
    assert beats.answer(1) == accepted(1, inject=[{"id": "x"}])
    assert beats.answer(1) == accepted(1)  # handed out once
    beats.fan_out(sent, {"ok": True, "ranks": [accepted(0, generation=1), accepted(1)]})
    assert beats.news == news + 2 and beats.answer(0) == accepted(0, generation=1)


def test_a_rank_silent_past_the_timeout_is_sent_at_once_and_not_again_once_refused() -> None:
    beats = registered(2)
    beats.heard(0, "heartbeat", report(0, step=1), 3.0)
    beats.heard(1, "heartbeat", report(1, step=1), 20.0)
    for beaten_at in (0.0, 6.0, 12.0, 18.0, 24.0):
        assert beats.next_due() == beaten_at + INTERVAL  # the interval comes first
        beats.beats(beaten_at + INTERVAL)
    assert beats.next_due() == 3.0 + TIMEOUT + 0.001  # rank 0's silence passes the timeout
    [sent] = beats.beats(3.0 + TIMEOUT + 0.001)
    assert dict((k, e["age"]) for k, e in sent)[0] > TIMEOUT * 1000
    beats.fan_out(sent, {"ok": True, "ranks": [{"ok": False, "reason": "stale"}, accepted(1)]})
    assert beats.answer(0) == {"ok": False, "reason": "stale"}  # it hears it is out
    assert [k for k, _e in beats.beats(40.0)[0]] == [1]


def test_a_rank_whose_connection_closed_is_not_beaten_for() -> None:
    beats = registered(3)
    beats.forget(1)
    assert [k for k, _e in beats.beats(INTERVAL)[0]] == [0, 2]


@settings(max_examples=50, deadline=None)
@given(phases=st.lists(st.text(max_size=4096), min_size=1, max_size=200))
def test_a_nodes_beat_fits_its_requests_whatever_its_ranks_say(phases: list[str]) -> None:
    beats = registered(len(phases))
    for rank, phase in enumerate(phases):
        beats.heard(rank, "heartbeat", report(rank, step=rank, phase=phase), 1.0)
    batches = beats.beats(2.0)
    assert [k for sent in batches for k, _e in sent] == list(range(len(phases)))
    for sent in batches:
        assert 1 <= len(sent) <= NODE_BEAT_RANKS
        body = json.dumps({"node": "h/0", "ranks": [e for _k, e in sent]}).encode()
        assert len(body) <= MAX_REQUEST_BYTES
        assert len(sent) == 1 or len(body) <= BEAT_BYTES + 200


# ----------------------------------------------------------------- the scheduler's side
def membership(nodes: int, per_node: int, clock: FakeClock) -> Membership:
    """A formed generation of ``nodes`` nodes of ``per_node`` ranks, registered by node beats."""
    ms = Membership(nodes * per_node, TOKEN, Timeouts(heartbeat_timeout=TIMEOUT), clock)
    for node in range(nodes):
        ms.heard_from_node(f"n{node}", per_node)
        for rank in range(node * per_node, (node + 1) * per_node):
            ms.register(Identity(str(rank), 100 + rank, 1, "h", rank), TOKEN, via=f"n{node}")
    ms.drain_events()
    return ms


def beat_node(ms: Membership, node: int, per_node: int, silent: float = 0.0) -> None:
    ms.heard_from_node(f"n{node}", per_node)
    for rank in range(node * per_node, (node + 1) * per_node):
        ms.heartbeat(Identity(str(rank), 100 + rank, 1, "h", rank), TOKEN, 5, None,
                     via=f"n{node}", silent=silent)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), nodes=st.integers(1, 6), per_node=st.integers(1, 4))
def test_a_node_is_judged_silent_exactly_when_its_beats_stop_for_the_timeout(
        data: st.DataObject, nodes: int, per_node: int) -> None:
    clock = FakeClock()
    ms = membership(nodes, per_node, clock)
    last = {node: 0.0 for node in range(nodes)}
    elapsed = 0.0
    for step in data.draw(st.lists(st.floats(0.5, 8.0), min_size=1, max_size=12)):
        clock.advance(step)
        elapsed += step
        for node in data.draw(st.sets(st.sampled_from(range(nodes)))):
            if elapsed - last[node] <= TIMEOUT:  # a judged node's supervisor is gone
                beat_node(ms, node, per_node)
                last[node] = elapsed
        ms.check()
    events = ms.drain_events()
    silent = {e["node"] for name, e in events if name == "node_silent"}
    assert silent == {f"n{node}" for node in range(nodes) if elapsed - last[node] > TIMEOUT}
    for node in range(nodes):
        states = {ms.members[str(r)].state for r in range(node * per_node, (node + 1) * per_node)}
        assert states == ({MemberState.LOST} if f"n{node}" in silent else {MemberState.ALIVE})
    verdicts = [e for name, e in events if name == "verdict"]
    assert sorted(v["rank"] for v in verdicts) == sorted(
        r for node in silent for r in range(int(node[1:]) * per_node, (int(node[1:]) + 1) * per_node))
    assert all(v["verdict"] == "heartbeat" and v["node"] in silent for v in verdicts)


def test_the_node_is_due_on_the_clock_when_its_beats_stop() -> None:
    clock = FakeClock()
    ms = membership(2, 2, clock)
    clock.advance(10.0)
    beat_node(ms, 1, 2)
    assert ms.next_due(after=clock.mono) == clock.mono - 10.0 + TIMEOUT  # node 0's
    clock.advance(TIMEOUT - 10.0 + 0.001)
    ms.check()
    assert [(e["node"], e["ranks"]) for n, e in ms.drain_events() if n == "node_silent"] == [
        ("n0", [0, 1])]


def test_a_rank_its_supervisor_has_not_heard_for_the_timeout_is_lost_at_once() -> None:
    clock = FakeClock()
    ms = membership(1, 2, clock)
    answer = ms.heartbeat(Identity("1", 101, 1, "h", 1), TOKEN, 5, None, via="n0",
                          silent=TIMEOUT + 0.5)
    assert not answer.to_json()["ok"]
    assert ms.members["1"].state is MemberState.LOST and ms.members["0"].state is MemberState.ALIVE
    [verdict] = [e for n, e in ms.drain_events() if n == "verdict"]
    assert (verdict["rank"], verdict["silent_s"], verdict["node"]) == (1, TIMEOUT + 0.5, "n0")


def test_a_node_beat_through_the_scheduler_answers_each_rank_and_shows_in_status(
        tmp_path: Path) -> None:
    sched = scheduler(tmp_path)
    ranks = [{"op": "register", **report(r), "step": None, "phase": None, "age": 0}
             for r in range(2)]
    reply = ask(sched, "node_beat", node="h/0", ranks=ranks)
    assert reply["ok"] and [(a["ok"], a["rank"], a["generation"]) for a in reply["ranks"]] == [
        (True, 0, 0), (True, 1, 0)]
    beat = [{**entry, "op": "heartbeat", "step": 3, "phase": "train", "age": 200} for entry in ranks]
    reply = ask(sched, "node_beat", node="h/0", ranks=beat)
    assert reply["ranks"] == [0, 0]  # plain heartbeats, answered in short: their generation
    node = NodeBeats(TIMEOUT, INTERVAL)  # the supervisor's side
    for key, entry in enumerate(beat):
        node.heard(key, "heartbeat", entry, 0.0)
    node.fan_out(list(enumerate(beat)), reply)
    assert [node.answer(key) for key in (0, 1)] == [accepted(0), accepted(1)]  # in full
    status = ask(sched, "status")
    assert status["nodes"]["h/0"]["beats"] == 2 and status["nodes"]["h/0"]["ranks"] == 2
    assert status["loop"]["node_beats"] == 2
    assert [(m["step"], m["phase"]) for m in status["members"]] == [(3, "train"), (3, "train")]
    refused = ask(sched, "node_beat", node="h/0", ranks=[{**ranks[0], "age": -1}])
    assert refused["reason"] == "bad_request"


def test_a_short_answer_is_the_full_answer_with_the_replys_fault_time() -> None:
    """The scheduler answers an accepted plain heartbeat with its generation alone; the
    supervisor hands the rank the whole answer, with the reply's fault time."""
    beats = registered(2)
    sent = beats.beats(INTERVAL)[0]
    beats.fan_out(sent, {"ok": True, "ranks": [{"ok": False, "reason": "stale"}, 4],
                         "fault_at": 1234.5})
    assert beats.answer(1) == accepted(1, generation=4, fault_at=1234.5)
    assert beats.ranks[0].judged and not beats.ranks[1].judged


def test_a_rank_registered_as_training_in_whole_generations_dies_without_a_cooldown(
        tmp_path: Path) -> None:
    """A ``@recovery.restartable`` process registers ``whole``: its peers wait for its
    return, so its death starts no cooldown (the others' deaths do), through its node's
    beat and the scheduler's request handling."""
    node = NodeBeats(TIMEOUT, INTERVAL)
    node.heard(0, "register", report(0, whole=True), 0.0)
    node.heard(1, "register", report(1), 0.0)
    [sent] = node.beats(0.0)
    assert [entry.get("whole") for _key, entry in sent] == [True, None]
    sched = scheduler(tmp_path)
    reply = ask(sched, "node_beat", node="h/0", ranks=[entry for _key, entry in sent])
    assert [answer["ok"] for answer in reply["ranks"]] == [True, True]
    for rank in (0, 1):
        sched.membership.report_exit(str(rank), 100 + rank, 1, abnormal=True, reason="SIGKILL",
                                     by="supervisor")
    assert sched.membership.cooldown_left("0") == 0.0
    assert sched.membership.cooldown_left("1") > sched.config.timeouts.rejoin_cooldown - 5
    assert sched.membership.fault_at is not None
    again = ask(sched, "register", **report(0, incarnation=2), ready=True)
    assert again["ok"], again


def test_a_generation_formed_by_a_registration_reaches_the_ranks_answered_before_it(
        tmp_path: Path) -> None:
    """Rank 1, relaunched, registers in the same node beat as rank 0's plain heartbeat,
    which comes first: rank 0's answer names the generation the registration formed, so
    rank 0 does not wait for its node's next beat (a second of an in-process restart)."""
    sched = scheduler(tmp_path)
    first = [{"op": "register", **report(r), "step": None, "phase": None, "age": 0, "whole": True}
             for r in range(2)]
    ask(sched, "node_beat", node="h/0", ranks=first)
    sched.membership.report_exit("1", 101, 1, abnormal=True, reason="SIGKILL", by="supervisor")
    before = sched.membership.generation
    beat = [{**first[0], "op": "heartbeat", "step": 5, "whole": None},
            {**first[1], "pid": 201, "incarnation": 2}]
    reply = ask(sched, "node_beat", node="h/0", ranks=beat)
    assert reply["ranks"][1]["ok"] and reply["ranks"][1]["generation"] > before
    assert reply["ranks"][0] == reply["ranks"][1]["generation"] == sched.membership.generation
