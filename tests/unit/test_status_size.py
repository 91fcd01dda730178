"""``tftctl status`` of a job with hundreds of ranks: a signed reply larger than a request
may be (16 KiB) still verifies."""

from __future__ import annotations

import threading
from pathlib import Path

from recovery.control.client import SchedulerControl
from recovery.control.rpc import Op, SchedulerLink
from recovery.control.scheduler import Scheduler
from recovery.control.signing import MAX_MESSAGE_BYTES
from recovery.runtime.generation_wait import missing_ranks
from support import free_tcp_port, wait_for_event
from support.sched_inprocess import TOKEN, scheduler_config

RANKS = 256
"""Ranks whose membership table is larger than a request may be (about 130 bytes each)."""


def test_the_status_of_a_job_of_256_ranks_verifies(tmp_path: Path) -> None:
    port = free_tcp_port()
    sched = Scheduler(scheduler_config(tmp_path, port, worker_num=RANKS))
    runner = threading.Thread(target=sched.run, daemon=True)
    runner.start()
    link = SchedulerLink("127.0.0.1", port, TOKEN, 10.0)
    control = SchedulerControl("127.0.0.1", port, TOKEN, timeout=10.0)
    try:
        wait_for_event(tmp_path / "logs", 30, "the scheduler serving", event="scheduler_start")
        assert link.wait_connected(10)
        for rank in range(RANKS):
            assert link.call(Op.REGISTER, node_id=str(rank), pid=1000 + rank, incarnation=0,
                             host="h", rank=rank, ready=True)["ok"]
        wait_for_event(tmp_path / "logs", 30, "the generation", event="generation")
        assert control._link.wait_connected(10)
        status = control.status()
        node = control.node_status(8, 8, missing=True)
        unverified = control._link.unverified
    finally:
        control.close()
        link.close()
        sched.request_stop("the test is over")
        runner.join(10)
    assert unverified == 0
    assert status is not None
    assert sorted(m["rank"] for m in status["members"]) == list(range(RANKS))
    assert len(str(status)) > MAX_MESSAGE_BYTES
    # A node's supervisor asks for its own ranks' rows and the job's facts only.
    assert node is not None
    assert [m["rank"] for m in node["members"]] == list(range(8, 16))
    assert node["others"] == {"training": RANKS - 8, "finished": 0, "finished_step": None}
    assert node["missing"] == [] and node["retired"] == []
    assert len(str(node)) < MAX_MESSAGE_BYTES


def test_a_worker_whose_generation_never_formed_names_the_missing_ranks(tmp_path: Path) -> None:
    """It asks for its own scope with the missing ranks, not the whole table."""
    port = free_tcp_port()
    sched = Scheduler(scheduler_config(tmp_path, port, worker_num=3))
    runner = threading.Thread(target=sched.run, daemon=True)
    runner.start()
    link = SchedulerLink("127.0.0.1", port, TOKEN, 10.0)
    try:
        wait_for_event(tmp_path / "logs", 30, "the scheduler serving", event="scheduler_start")
        assert link.wait_connected(10)
        assert link.call(Op.REGISTER, node_id="0", pid=1000, incarnation=0, host="h", rank=0,
                         ready=True)["ok"]
        missing = missing_ranks(link, 3, 0)
    finally:
        link.close()
        sched.request_stop("the test is over")
        runner.join(10)
    assert missing == [1, 2]
