"""Requests to a real scheduler (in this process, over its real TCPStore) that arrive late,
twice, or malformed: each is carried out at most once, answered, and none ends the scheduler.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from recovery.control import replies
from recovery.control.client import ExitReport, SchedulerControl
from recovery.control.files import StateFile
from recovery.control.members import Identity
from recovery.control.rpc import REQUESTS, NoReply, Op, SchedulerLink, open_client, reply_key
from recovery.control.scheduler import Scheduler
from recovery.control.signing import Kind, job_key, new_nonce, seal
from recovery.env import DEFAULT_RUN_ID
from recovery.runtime.cluster import ClusterContext, _Session
from recovery.runtime.heartbeat import Heartbeat
from recovery.timeouts import Timeouts
from support import events, scheduler_stalled, wait_for, wait_for_event
from support.sched_inprocess import TOKEN, answer, running_scheduler, scheduler_config, signed

pytestmark = pytest.mark.timeout(60)

REPLY_TIMEOUT = 0.5
"""The clients' wait for one answer: short, so that a stalled scheduler outlasts it."""


def claimant(port: int, rank: int) -> ClusterContext:
    """Rank ``rank`` of generation 3, as a survivor of a fault claims last words."""
    link = SchedulerLink("127.0.0.1", port, TOKEN, reply_timeout=REPLY_TIMEOUT)
    assert link.wait_connected(10)
    identity = Identity(str(rank), os.getpid(), rank, "h", rank)
    session = _Session(link, Heartbeat(link, identity, 1.0, 3), Timeouts(cluster_time_out=30.0),
                       None)
    return ClusterContext(rank, 2, 3, str(rank), rank, "gloo", session)


def test_a_last_words_grant_carried_out_after_its_claimant_timed_out_is_learned_by_it(
        tmp_path: Path, free_port: int) -> None:
    with running_scheduler(tmp_path, free_port):
        first, second = claimant(free_port, 0), claimant(free_port, 1)
        learned: list[bool] = []
        asking = threading.Thread(target=lambda: learned.append(first.claim_last_words(7, True)))
        with scheduler_stalled(tmp_path / "recovery"):
            asking.start()
            # What the scheduler must get over: its answer comes after the claimant's
            # wait for it ended. Only time tells that a timeout passed.
            asking.join(REPLY_TIMEOUT * 3)
        asking.join(30)
        assert (learned, second.claim_last_words(7, True)) == ([True], False)
        claims = events(tmp_path / "logs", "last_words_claim")
        assert [(c["rank"], c["granted"]) for c in claims] == [(0, True), (1, False)]


def test_an_exit_report_re_sent_after_a_timeout_is_counted_once(
        tmp_path: Path, free_port: int) -> None:
    control = SchedulerControl("127.0.0.1", free_port, TOKEN, timeout=REPLY_TIMEOUT)
    try:
        with running_scheduler(tmp_path, free_port) as scheduler:
            wait_for(lambda: control.status() is not None, 10, "the control connected")
            with scheduler_stalled(tmp_path / "recovery"):
                control.report(ExitReport("1", 1, 4242, 3, abnormal=True, reason="SIGKILL"))
            first = wait_for_event(tmp_path / "logs", 10, "the report carried out late",
                                   event="cooldown", node_id="1")
            # The report is re-sent before each request; a status under load may take
            # longer than the short reply timeout, so ask until one is answered.
            wait_for(lambda: control.status() is not None, 10, "a status after the stall")
            assert [e["until"] for e in events(tmp_path / "logs", "cooldown")] == [first["until"]]
            assert scheduler.membership.cooldowns["1"] == first["until"]
    finally:
        control.close()


def test_a_reply_to_another_jobs_request_is_removed_by_the_scheduler(
        tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replies, "REPLY_KEEP", 0.5)
    with running_scheduler(tmp_path, free_port):
        store = open_client("127.0.0.1", free_port, 10)
        store.queue_push(REQUESTS, signed("status", token="another job's token", rid="stranger"))
        wait_for(lambda: store.check([reply_key("stranger")]), 10, "the reply set")
        wait_for(lambda: not store.check([reply_key("stranger")]), 10, "the reply removed")


def test_a_reply_given_up_on_is_removed_by_its_client_not_by_the_scheduler(
        tmp_path: Path, free_port: int) -> None:
    """docs/scale.md: the scheduler spends no round trip on cleaning up after the job's
    own clients; a client removes the reply it stopped waiting for once a later request
    of its own is answered (the queue is first in, first out)."""
    with running_scheduler(tmp_path, free_port) as scheduler:
        released = threading.Event()
        status = scheduler._handlers[Op.STATUS]
        scheduler._handlers[Op.STATUS] = lambda request: (released.wait(10), status(request))[1]
        link = SchedulerLink("127.0.0.1", free_port, TOKEN, reply_timeout=REPLY_TIMEOUT)
        store = open_client("127.0.0.1", free_port, 10)
        try:
            assert link.wait_connected(10)
            with pytest.raises(NoReply):
                link.call(Op.STATUS, rid="given-up")
            released.set()
            wait_for(lambda: store.check([reply_key("given-up")]), 10, "the late reply set")
            assert scheduler._sent.next_expiry() is None  # none of the scheduler's to remove
            assert link.wait_connected(10)
            assert link.call(Op.STATUS)["ok"]
            assert not store.check([reply_key("given-up")])
        finally:
            link.close()


def ask(store: Any, raw: bytes | str, rid: str) -> dict[str, Any]:
    """Push ``raw`` as a request and return the reply set under ``rid``."""
    store.queue_push(REQUESTS, raw)
    store.wait([reply_key(rid)], timedelta(seconds=10))
    return answer(store.get(reply_key(rid)))


def with_body(op: str, rid: str, body: str) -> str:
    """A request signed with the job's token whose body is ``body``, as it is."""
    return seal(job_key(TOKEN, DEFAULT_RUN_ID, ""), Kind.REQUEST, op, rid, new_nonce(), body)


MALFORMED_BODIES = {
    "overflow": ("register", '{"node_id": "0", "pid": 1e999, "incarnation": 0}'),
    "nan": ("last_words", '{"rank": 0, "generation": NaN, "step": 1, "consistent": true}'),
    "deep": ("status", '{"x": %s}' % ("[" * 5000 + "]" * 5000)),
    "bool_rank": ("inject", '{"rank": true, "fault": "kill"}'),
    "no_object": ("status", "[]"),
    "unknown_op": ("reboot", "{}"),
}
"""rid -> (op, body): signed, but not a request of the op's; each is answered
``bad_request``. Signed when sent (a signature carries its time: one made at import would be
stale by the time a long suite reaches the test)."""


def test_malformed_requests_are_answered_bad_request_and_change_nothing_persisted(
        tmp_path: Path, free_port: int) -> None:
    state = StateFile(tmp_path / "recovery")
    with running_scheduler(tmp_path, free_port):
        store = open_client("127.0.0.1", free_port, 10)
        assert ask(store, signed("status", rid="before"), "before")["ok"]
        saved = wait_for(lambda: state.path.exists() and state.path.read_bytes(), 10,
                         "the state persisted")
        # Without a header to answer under: ignored (too large for one too).
        for raw in (b"\xff\xfe not json", "[" * 100_000 + "]" * 100_000, "[]", '"op"',
                    json.dumps({"op": "status", "rid": "unsigned"}),
                    with_body("inject", "huge", '{"rank": 0, "fault": "%s"}' % ("k" * 100_000))):
            store.queue_push(REQUESTS, raw)
        for rid, (op, body) in MALFORMED_BODIES.items():
            reply = ask(store, with_body(op, rid, body), rid)
            assert (reply["ok"], reply["reason"]) == (False, "bad_request"), rid
        assert ask(store, signed("status", rid="after"), "after")["ok"]
        assert not store.check([reply_key("unsigned")]) and not store.check([reply_key("huge")])
        assert state.path.read_bytes() == saved
        assert events(tmp_path / "logs", "scheduler_stop") == []


def test_a_retry_reaching_a_relaunched_scheduler_is_answered_as_the_first_attempt_was(
        tmp_path: Path) -> None:
    """The first attempt was carried out and persisted, then the scheduler was killed
    before it replied: its relaunch answers the retry and does not count the exit again."""
    report = {"node_id": "1", "rank": 1, "pid": 4242, "incarnation": 3, "abnormal": True,
              "reason": "SIGKILL"}
    killed = Scheduler(scheduler_config(tmp_path, port=0))
    _rid, first = killed._handle(signed("exit", rid="exit-1", **report))
    killed._after_request()  # persisted; the reply is never sent

    relaunched = Scheduler(scheduler_config(tmp_path, port=0))
    assert relaunched._reload()
    rid, again = relaunched._handle(signed("exit", rid="exit-1", **report))  # a new attempt
    assert first is not None and again is not None
    assert (rid, answer(again)) == ("exit-1", answer(first))
    relaunched._after_request()
    assert len(events(tmp_path / "logs", "cooldown")) == 1


def test_a_scheduler_failing_on_its_own_leaves_its_state_to_its_relaunch(
        tmp_path: Path, free_port: int) -> None:
    state = StateFile(tmp_path / "recovery")
    with running_scheduler(tmp_path, free_port):
        link = SchedulerLink("127.0.0.1", free_port, TOKEN, reply_timeout=5.0)
        assert link.wait_connected(10)
        assert link.call(Op.REGISTER, node_id="0", pid=100, incarnation=0, host="h")["ok"]
        # Its disk fails: the state's directory is a file now.
        saved = state.path.parent.rename(state.path.parent.with_name("saved"))
        state.path.parent.write_text("")
        store = open_client("127.0.0.1", free_port, 10)
        store.queue_push(REQUESTS, signed("register", node_id="1", pid=101, incarnation=0))
        stop = wait_for_event(tmp_path / "logs", 10, "the scheduler stopping",
                              event="scheduler_stop")
        assert stop["exitcode"] == 1 and "internal error" in stop["reason"]
        link.close()
    state.path.parent.unlink()
    saved.rename(state.path.parent)
    relaunched = Scheduler(scheduler_config(tmp_path, free_port))
    assert relaunched._reload() and list(relaunched.membership.members) == ["0"]
