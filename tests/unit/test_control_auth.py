"""The control plane against a stranger on the store (issue 14): what popping a request
teaches, what a forged or malformed reply does, how many refusals reach the disk, and a
replayed request. Real TCPStores in this process; the stranger is a plain store client."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from recovery.control.client import SchedulerControl
from recovery.control.rpc import REQUESTS, NoReply, Op, SchedulerLink, SchedulerUnavailable, open_client, reply_key
from recovery.control.scheduler import Scheduler, host_store
from recovery.control.signing import Kind, job_key, seal, unseal
from recovery.env import DEFAULT_RUN_ID
from support import events
from support.sched_inprocess import TOKEN, answer, scheduler_config, signed

pytestmark = pytest.mark.timeout(60)

_RID = re.compile(rb"\b[0-9a-f]{32}\b")
"""The request id in a request: the first word of 32 hex digits (any wire format)."""


@contextmanager
def stranger_store(port: int, answer_with: Callable[[bytes], str | bytes | None]
                   ) -> Iterator[list[bytes]]:
    """A store with no scheduler: a stranger pops every request (they are listed) and
    sets ``answer_with(request)`` under its id, as anyone who reaches the port can."""
    server = host_store("127.0.0.1", port, None)
    popped: list[bytes] = []
    stop = threading.Event()

    def pop() -> None:
        client = open_client("127.0.0.1", port, 30)
        while not stop.wait(0.01):
            if client.queue_len(REQUESTS) == 0:
                continue
            raw = client.queue_pop(REQUESTS)
            popped.append(raw)
            rid = _RID.search(raw)
            reply = answer_with(raw)
            if rid is not None and reply is not None:
                client.set(reply_key(rid.group().decode()), reply)

    thread = threading.Thread(target=pop, daemon=True)
    thread.start()
    try:
        yield popped
    finally:
        stop.set()
        thread.join(10)
        del server


def test_a_client_that_pops_a_request_learns_no_token(free_port: int) -> None:
    with stranger_store(free_port, lambda _raw: None) as popped:
        link = SchedulerLink("127.0.0.1", free_port, TOKEN, reply_timeout=0.5)
        try:
            for op, fields in ((Op.REGISTER, {"node_id": "0", "pid": 1, "incarnation": 0}),
                               (Op.INJECT, {"rank": 0, "fault": "kill"}), (Op.STATUS, {})):
                assert link.wait_connected(10)
                with pytest.raises(NoReply):  # the stranger took it
                    link.call(op, **fields)
        finally:
            link.close()
    assert len(popped) == 3
    assert not [raw for raw in popped if TOKEN.encode() in raw]


FORGED_STATUS = b'{"ok": true, "members": [{"rank": 0, "state": "lost"}]}'
MALFORMED = b'{"ok": true, "members": {"x": [1]}, "until": "soon"}'


def copied_header(body: bytes, key: bytes) -> Callable[[bytes], str | None]:
    """A reply claiming to answer the popped request (its op, id and nonce), signed
    with ``key``."""
    def reply(raw: bytes) -> str | None:
        try:
            unseal(b"", Kind.REQUEST, raw)
        except ValueError as err:
            header = getattr(err, "header", None)
            if header is not None:
                return seal(key, Kind.REPLY, header.op, header.rid, header.nonce,
                            body.decode())
        return None
    return reply


@pytest.mark.parametrize(("forge", "expected"), [
    (lambda _raw: FORGED_STATUS, "ignored"),
    (lambda _raw: MALFORMED, "ignored"),
    (lambda _raw: b"\xff not even JSON", "ignored"),
    (copied_header(FORGED_STATUS, b"a guessed token"), "ignored"),
    # The genuine token, a malformed answer (a scheduler's bug): no crash either.
    (copied_header(MALFORMED, job_key(TOKEN, DEFAULT_RUN_ID, "")), "verified"),
], ids=["plain", "malformed", "garbage", "wrong-key", "malformed-but-signed"])
def test_a_forged_or_malformed_reply_is_ignored_and_counted(
        free_port: int, forge: Callable[[bytes], bytes | str | None], expected: str) -> None:
    with stranger_store(free_port, forge):
        control = SchedulerControl("127.0.0.1", free_port, TOKEN, timeout=2.0)
        try:
            assert control._link.wait_connected(10)
            answers = [control.status(), control.node_status(0, 2, missing=True)]
            assert answers == ([None, None] if expected == "ignored" else [json.loads(MALFORMED)] * 2)
            unverified = control._link.unverified
            assert unverified == (2 if expected == "ignored" else 0)
        finally:
            control.close()


def test_refusals_are_reported_at_most_once_per_interval(tmp_path: Path) -> None:
    """A stranger's flood of registrations costs one event and one log line."""
    scheduler = Scheduler(scheduler_config(tmp_path, port=0))
    for pid in range(300):
        scheduler._handle(signed("register", token="a guess", node_id="0", pid=pid,
                                 incarnation=0))
        scheduler._handle(b'{"op": "register", "rid": "r%d", "token": "", "pid": %d}'
                          % (pid, pid))
        scheduler._after_request()
    refused = events(tmp_path / "logs", "request_refused")
    assert [(e["reason"], e["count"]) for e in refused] == [("signature", 1)]
    assert events(tmp_path / "logs", "refuse") == [] and not scheduler.membership.members


def test_a_replayed_request_is_not_carried_out_again(tmp_path: Path) -> None:
    """A stranger who saw a signed injection pushes it again: dropped, unanswered."""
    scheduler = Scheduler(scheduler_config(tmp_path, port=0))
    request = signed("inject", rank=0, fault="hang", at_step=5)
    rid, reply = scheduler._handle(request)
    assert reply is not None and answer(reply)["ok"]
    assert scheduler._handle(request) == (None, None)
    assert len(scheduler.injections.pending) == 1
    # Asked again as a client does, under the same id (a new attempt): the first answer.
    _rid, again = scheduler._handle(signed("inject", rid=rid, rank=0, fault="hang", at_step=5))
    assert again is not None and answer(again)["id"] == answer(reply)["id"]
    assert len(scheduler.injections.pending) == 1



def test_a_late_reply_to_an_earlier_attempt_is_waited_past_not_counted_forged(
        free_port: int) -> None:
    """Attempt 1 stops waiting; its genuine reply comes late and is what attempt 2 finds
    first under the request's id: attempt 2 takes it away and waits for its own."""
    key = job_key(TOKEN, DEFAULT_RUN_ID, "")
    server = host_store("127.0.0.1", free_port, None)
    answered = threading.Event()

    def scheduler() -> None:  # answers every attempt, the first one late
        client = open_client("127.0.0.1", free_port, 30)
        for attempt in range(2):
            header = unseal(key, Kind.REQUEST, client.queue_pop(REQUESTS))
            if attempt == 0:
                time.sleep(1.0)  # past attempt 1's reply timeout
            else:
                time.sleep(0.3)  # attempt 2 meets attempt 1's reply first
            client.set(reply_key(header.rid), seal(key, Kind.REPLY, header.op, header.rid,
                                                   header.nonce, f'{{"ok": true, "n": {attempt}}}'))
        answered.set()

    thread = threading.Thread(target=scheduler, daemon=True)
    thread.start()
    link = SchedulerLink("127.0.0.1", free_port, TOKEN, reply_timeout=0.6)
    try:
        assert link.wait_connected(10)
        with pytest.raises(NoReply):
            link.call(Op.STATUS, rid="same-request")
        deadline = time.monotonic() + 10
        while True:  # the timed-out connection is being made again
            try:
                time.sleep(0.5)  # attempt 1's late reply is set by now
                reply = link.call(Op.STATUS, rid="same-request")
                break
            except SchedulerUnavailable:
                assert time.monotonic() < deadline
        assert reply == {"ok": True, "n": 1} and link.unverified == 0
        assert answered.wait(10)
    finally:
        link.close()
        thread.join(10)
        del server
