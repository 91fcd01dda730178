"""The scheduler's request loop, in this process, and SchedulerControl against it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from recovery.control.client import ExitReport, SchedulerControl
from recovery.control.files import Endpoint, StateFile
from recovery.control.members import Identity
from recovery.control.rpc import Op, SchedulerLink
from recovery.runtime.cluster import ClusterContext, ClusterError, _Session
from recovery.runtime.heartbeat import Heartbeat
from recovery.runtime.registration import register as register_worker
from recovery.timeouts import Timeouts
from support import events, wait_for_event
from support.sched_inprocess import TOKEN, running_scheduler

pytestmark = pytest.mark.timeout(60)


def register(link: SchedulerLink, node_id: str, pid: int) -> dict[str, object]:
    return link.call(Op.REGISTER, node_id=node_id, pid=pid, incarnation=0, host="h", rank=None)


def test_control_answers_safely_while_the_scheduler_is_down_and_delivers_later(
        tmp_path: Path, free_port: int) -> None:
    control = SchedulerControl("127.0.0.1", free_port, TOKEN, timeout=1.0)
    try:
        started = time.monotonic()
        control.report(ExitReport("1", 1, 4242, 3, abnormal=True, reason="SIGKILL"))
        assert control.status() is None
        assert time.monotonic() - started < 1.0

        with running_scheduler(tmp_path, free_port):
            cooldown = wait_for_event(tmp_path / "logs", 30, "the queued report delivered",
                                      event="cooldown", node_id="1")
            assert cooldown["reason"] == "SIGKILL"
            assert cooldown["until"] > time.time() + 25.0
    finally:
        control.close()


def test_requests_are_served_and_the_end_is_persisted(tmp_path: Path, free_port: int) -> None:
    link = SchedulerLink("127.0.0.1", free_port, TOKEN, reply_timeout=5.0)
    stranger = SchedulerControl("127.0.0.1", free_port, "another-job", timeout=1.0)
    try:
        with running_scheduler(tmp_path, free_port) as scheduler:
            endpoint = Endpoint.read(tmp_path / "logs")
            assert endpoint is not None and endpoint.port == free_port
            assert link.wait_connected(10)
            assert register(link, "0", 100) == {"ok": True, "node_id": "0", "rank": 0,
                                                "generation": 0, "fault_at": None}
            refused = register(link, "0", 101)
            assert (refused["ok"], refused["reason"]) == (False, "duplicate")
            status = link.call(Op.STATUS)
            assert status["missing"] == [1] and status["members"][0]["pid"] == 100
            # A wrong token can neither read, act nor learn verdicts: the scheduler's
            # unsigned refusals are all it gets, and it does not act on them.
            assert stranger._link.wait_connected(10)
            assert stranger.status() is None
            stranger.report(ExitReport("0", 0, 100, 0, abnormal=True, reason="forged"))
            assert stranger.status() is None
            assert scheduler.membership.cooldown_left("0") == 0.0
            assert stranger._link.unverified >= 2
        assert Endpoint.read(tmp_path / "logs") is None
        state = StateFile(tmp_path / "recovery").load()
        assert state is not None and state["finished"] is True
        assert json.dumps(state).find(TOKEN) == -1  # only a digest of the token is kept
        assert events(tmp_path / "logs", "scheduler_stop")[0]["reason"] == "the test is over"
    finally:
        link.close()
        stranger.close()


def test_a_worker_ending_on_an_uncaught_exception_leaves_abnormally(
        tmp_path: Path, free_port: int) -> None:
    link = SchedulerLink("127.0.0.1", free_port, TOKEN, reply_timeout=5.0)
    with running_scheduler(tmp_path, free_port):
        assert link.wait_connected(10)
        register(link, "0", os.getpid())
        identity = Identity("0", os.getpid(), 0, "h", 0)
        ctx = ClusterContext(0, 2, 0, "0", 0, "gloo",
                             _Session(link, Heartbeat(link, identity, 1.0, 0), Timeouts(), None))
        ctx._note_uncaught(lambda *_: None)(RuntimeError, RuntimeError("boom"), None)
        ctx._finish_at_exit()  # what atexit runs
        leave = wait_for_event(tmp_path / "logs", 10, "the leave", event="leave")
        assert (leave["state"], leave["reason"], leave["by"]) == (
            "dead", "uncaught exception", "worker")
        assert events(tmp_path / "logs", "cooldown")[0]["node_id"] == "0"


class RefusingLink:
    """A scheduler that always says: node 1 is taken, try again soon."""

    where = "127.0.0.1:1"

    def wait_connected(self, timeout: float) -> bool:
        return True

    def call(self, op: Op, **fields: object) -> dict[str, object]:
        return {"ok": False, "reason": "duplicate", "retry_after": 0.05,
                "message": "node 1 is held by a live process (pid 9 on h, incarnation 0)"}


def test_a_worker_refused_until_cluster_time_out_gives_up_with_the_reason() -> None:
    with pytest.raises(ClusterError, match=r"not admitted within cluster_time_out: "
                       r"registration refused \(duplicate\): node 1 is held"):
        register_worker(RefusingLink(), Identity("1", 1, 0, "h"),  # type: ignore[arg-type]
                  time.monotonic() + 0.3)
