"""Fault injection and last-words arbitration: the scheduler's decisions, their persistence,
the worker's inbox, and what ``deliver`` raises (what it does to a process:
tests/integration/test_inject_delivered.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recovery.control.claims import LastWords
from recovery.control.inject import Inbox, InjectedError, Injection, check, deliver
from recovery.control.members import Identity
from recovery.control.rpc import Op, SchedulerUnavailable
from recovery.control.scheduler import Scheduler
from recovery.faults import DeviceError, is_recoverable_device_error
from recovery.runtime.cluster import ClusterContext, _Session
from recovery.runtime.heartbeat import Heartbeat
from recovery.timeouts import Timeouts
from support import events
from support.sched_inprocess import ask, reloaded, scheduler

WORKER = {"node_id": "1", "pid": 101, "incarnation": 0, "host": "h"}


# ----------------------------------------------------------------- INJECT
@pytest.mark.parametrize(("fields", "message"), [
    ({"rank": 2, "fault": "uce"}, "rank 2 is beyond worker_num=2"),
    ({"rank": -1, "fault": "uce"}, "rank -1 is beyond worker_num=2"),
    ({"rank": 0, "fault": "segfault"}, "unknown fault 'segfault'"),
    ({"rank": 0, "fault": "hang", "at_step": 0}, "at_step must be at least 1"),
])
def test_an_invalid_injection_is_refused_and_queues_nothing(
        tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    sched = scheduler(tmp_path)
    reply = ask(sched, "inject", **fields)
    assert (reply["ok"], reply["reason"]) == (False, "bad_injection")
    assert message in reply["message"]
    assert sched.injections.pending == [] and events(tmp_path / "logs", "inject") == []


def test_an_injection_with_a_wrong_token_is_refused(tmp_path: Path) -> None:
    sched = scheduler(tmp_path)
    reply = ask(sched, "inject", token="another-job", rank=0, fault="kill")
    assert (reply["ok"], reply["reason"], reply["signed"]) == (False, "token", False)
    assert sched.injections.pending == []


def test_an_injection_is_persisted_handed_out_once_and_to_its_rank_only(
        tmp_path: Path) -> None:
    sched = scheduler(tmp_path)
    assert ask(sched, "register", **WORKER, rank=None)["ok"]
    reply = ask(sched, "inject", rank=1, fault="uce", at_step=20)
    assert reply["ok"] and reply["id"]
    [event] = events(tmp_path / "logs", "inject")
    assert {k: event[k] for k in ("rank", "fault", "at_step", "id", "via")} == {
        "rank": 1, "fault": "uce", "at_step": 20, "id": reply["id"], "via": "scheduler"}
    assert ask(sched, "inject", rank=0, fault="hang")["ok"]  # for another rank

    # Queued and persisted before the reply: a relaunched scheduler still has both.
    assert [(i.rank, i.fault) for i in reloaded(tmp_path).injections.pending] == [
        (1, "uce"), (0, "hang")]

    beat = ask(sched, "heartbeat", **WORKER, step=3, phase="computing")
    assert beat["inject"] == [{"id": reply["id"], "rank": 1, "fault": "uce", "at_step": 20}]
    assert "inject" not in ask(sched, "heartbeat", **WORKER, step=4)  # at most once
    # The handing out was persisted too: a relaunched scheduler does not send it again.
    assert [i.rank for i in reloaded(tmp_path).injections.pending] == [0]


def test_an_injection_queued_before_its_rank_registers_comes_with_the_registration(
        tmp_path: Path) -> None:
    """Beats are spaced (seconds apart): a fast rank could finish before its first one,
    so an injection already waiting for the rank is handed over as it registers (CI saw
    a 60-step single-rank job end 1 s after registering, its ``uce`` never delivered)."""
    sched = scheduler(tmp_path)
    queued = ask(sched, "inject", rank=1, fault="uce", at_step=40)
    registered = ask(sched, "register", **WORKER, rank=None)
    assert registered["ok"] and registered["rank"] == 1
    assert registered["inject"] == [{"id": queued["id"], "rank": 1, "fault": "uce",
                                     "at_step": 40}]
    assert "inject" not in ask(sched, "heartbeat", **WORKER, step=1)  # at most once
    assert reloaded(tmp_path).injections.pending == []  # the handing out was persisted


def test_a_refused_heartbeat_gets_no_injection(tmp_path: Path) -> None:
    sched = scheduler(tmp_path)
    assert ask(sched, "register", **WORKER, rank=None)["ok"]
    assert ask(sched, "inject", rank=1, fault="kill")["ok"]
    stale = ask(sched, "heartbeat", **{**WORKER, "pid": 999}, step=1)
    assert stale["ok"] is False and "inject" not in stale
    assert len(sched.injections.pending) == 1


def test_the_phase_rides_on_heartbeats_into_the_status(tmp_path: Path) -> None:
    sched = scheduler(tmp_path)
    ask(sched, "register", **WORKER, rank=None)
    ask(sched, "heartbeat", **WORKER, step=7, phase="updating")
    [member] = ask(sched, "status")["members"]
    assert (member["step"], member["phase"]) == (7, "updating")


# ----------------------------------------------------------------- LAST_WORDS
def claim(sched: Scheduler, rank: int, generation: int, consistent: bool = True,
          step: int = 40) -> bool:
    reply = ask(sched, "last_words", rank=rank, generation=generation, step=step,
                consistent=consistent, reason="peer died")
    assert reply["ok"], reply
    return bool(reply["save"])


def test_the_first_consistent_claim_of_a_generation_wins_and_the_grant_survives_a_reload(
        tmp_path: Path) -> None:
    sched = scheduler(tmp_path)
    assert not claim(sched, rank=2, generation=0, consistent=False)  # mid-update: never
    assert claim(sched, rank=0, generation=0)
    assert not claim(sched, rank=1, generation=0)
    assert claim(sched, rank=0, generation=0)  # the winner asking again
    assert not claim(sched, rank=0, generation=0, step=41)
    assert claim(sched, rank=1, generation=1)  # the next episode
    assert [(e["rank"], e["generation"], e["granted"])
            for e in events(tmp_path / "logs", "last_words_claim")] == [
        (2, 0, False), (0, 0, True), (1, 0, False), (0, 0, True), (0, 0, False), (1, 1, True)]

    again = reloaded(tmp_path)
    assert not claim(again, rank=2, generation=0)
    assert not claim(again, rank=0, generation=1)
    assert claim(again, rank=2, generation=2)


def test_an_inconsistent_claim_alone_is_never_granted() -> None:
    arbiter = LastWords()
    assert not arbiter.claim(0, 0, 10, consistent=False)
    assert not arbiter.claim(0, 0, 10, consistent=False)
    assert arbiter.grants == {}


def test_a_malformed_persisted_queue_is_refused_whole(tmp_path: Path) -> None:
    sched = scheduler(tmp_path)
    ask(sched, "register", **WORKER, rank=None)
    state = tmp_path / "recovery" / "scheduler" / "state.json"
    data = json.loads(state.read_text())
    state.write_text(json.dumps({**data, "injections": [{"rank": 1}]}))
    fresh = scheduler(tmp_path)
    assert not fresh._reload()
    assert fresh.membership.members == {} and fresh.injections.pending == []


# ----------------------------------------------------------------- the worker's side
def test_pending_injection_returns_the_oldest_due_one_once() -> None:
    inbox = Inbox()
    inbox.add([Injection("a", 1, "uce", 20), Injection("b", 1, "hang", None),
               Injection("c", 1, "exception", 10)])
    assert inbox.take_due(5) == Injection("b", 1, "hang", None)
    assert inbox.take_due(5) is None
    assert inbox.take_due(20) == Injection("a", 1, "uce", 20)
    assert inbox.take_due(21) == Injection("c", 1, "exception", 10)  # late, still due
    assert inbox.take_due(100) is None


def test_without_a_scheduler_nothing_is_pending_and_no_claim_is_granted() -> None:
    ctx = ClusterContext(0, 1, 0, "0", 0, "gloo")
    ctx.report_phase("computing")
    assert ctx.pending_injection(1) is None
    assert ctx.claim_last_words(1, consistent=True) is False


class FakeLink:
    """Answers every request with ``reply`` (or raises it), and remembers the requests."""

    where = "127.0.0.1:1"

    def __init__(self, reply: dict[str, Any] | Exception, connected: bool = True) -> None:
        self.reply = reply
        self.connected = connected
        self.requests: list[tuple[Op, dict[str, Any]]] = []

    def wait_connected(self, timeout: float) -> bool:
        return self.connected

    def call(self, op: Op, **fields: Any) -> dict[str, Any]:
        self.requests.append((op, fields))
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply

    def call_until(self, op: Op, deadline: float, **fields: Any) -> dict[str, Any]:
        if not self.connected:
            raise SchedulerUnavailable("no connection")
        return self.call(op, **fields)


def context(link: FakeLink) -> ClusterContext:
    heartbeat = Heartbeat(link, Identity("1", 101, 0, "h", 1), 1.0, 3)  # type: ignore[arg-type]
    return ClusterContext(1, 2, 3, "1", 0, "gloo",
                          _Session(link, heartbeat, Timeouts(), None))  # type: ignore[arg-type]


def test_a_beat_sends_step_and_phase_and_files_what_the_reply_carries() -> None:
    link = FakeLink({"ok": True, "generation": 3, "inject": [
        {"id": "u1", "rank": 1, "fault": "uce", "at_step": 9}]})
    ctx = context(link)
    ctx.report_step(8)
    ctx.report_phase("updating")
    assert ctx._session is not None and ctx._session.heartbeat.beat()
    [(op, fields)] = link.requests
    assert (op, fields["step"], fields["phase"]) == (Op.HEARTBEAT, 8, "updating")
    assert ctx.pending_injection(8) is None
    assert ctx.pending_injection(9) == Injection("u1", 1, "uce", 9)
    assert ctx.pending_injection(9) is None


def test_a_claim_sends_the_generation_and_is_false_when_the_scheduler_is_away() -> None:
    granted = FakeLink({"ok": True, "save": True})
    assert context(granted).claim_last_words(40, consistent=True, reason="peer died")
    assert granted.requests == [(Op.LAST_WORDS, {"rank": 1, "generation": 3, "step": 40,
                                                 "consistent": True, "reason": "peer died"})]
    assert not context(FakeLink({"ok": True, "save": False})).claim_last_words(40, True)
    assert not context(FakeLink(SchedulerUnavailable("down"))).claim_last_words(40, True)
    unconnected = FakeLink({"ok": True, "save": True}, connected=False)
    assert not context(unconnected).claim_last_words(40, True)
    assert unconnected.requests == []


def test_check_accepts_every_fault_at_a_valid_rank_and_step() -> None:
    for fault in ("kill", "term", "hang", "uce", "exception"):
        assert check(1, fault, None, 2) is None and check(0, fault, 1, 2) is None


def test_uce_raises_a_recoverable_device_error_and_exception_an_ordinary_one() -> None:
    with pytest.raises(DeviceError, match=r"injection u1\) at step 20") as uce:
        deliver(Injection("u1", 1, "uce", 20))
    assert is_recoverable_device_error(uce.value)
    with pytest.raises(InjectedError, match="injection e1") as error:
        deliver(Injection("e1", 1, "exception", None))
    assert not is_recoverable_device_error(error.value)


def test_an_injection_reaches_its_rank_through_its_nodes_beat_once(tmp_path: Path) -> None:
    """A node's beat answers each of its ranks as its own heartbeat would: the rank the
    injection is for gets it, in that beat's answer only; the other rank none."""
    sched = scheduler(tmp_path)

    def beat(op: str) -> list[dict[str, Any]]:
        ranks = [{"op": op, "node_id": str(rank), "pid": 100 + rank, "incarnation": 0,
                  "host": "h", "rank": None, "step": 3, "phase": None, "age": 0}
                 for rank in (0, 1)]
        reply = ask(sched, "node_beat", node="h/0", ranks=ranks)
        assert reply["ok"], reply
        return reply["ranks"]

    assert [answer["ok"] for answer in beat("register")] == [True, True]
    assert ask(sched, "inject", rank=1, fault="uce", at_step=20)["ok"]
    first = beat("heartbeat")
    assert "inject" not in first[0]
    assert [(i["rank"], i["fault"], i["at_step"]) for i in first[1]["inject"]] == [(1, "uce", 20)]
    assert all("inject" not in answer for answer in beat("heartbeat"))
    assert sched.injections.pending == []
