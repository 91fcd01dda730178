"""The node's beat server (launcher/supervisor/beats.py) against a real scheduler."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from launcher.supervisor.beats import BeatServer
from recovery.control.beat_channel import LocalLink
from recovery.control.rpc import Op, SchedulerLink
from recovery.control.scheduler import Scheduler
from recovery.env import DEFAULT_RUN_ID
from recovery.timeouts import Timeouts
from support import free_tcp_port, wait_for_event
from support.sched_inprocess import TOKEN, scheduler_config

ANSWER_WITHIN = 3.0
"""Seconds a registration may take here: below the 5 s a node beat waits for its reply,
after which the worker asks again."""
SCHEDULER_LATE = 0.3
"""Seconds after the worker's registration that the scheduler starts serving."""


def test_a_worker_that_registers_before_the_scheduler_serves_is_answered_once_it_does(
        tmp_path: Path) -> None:
    """The first worker's connection starts the supervisor's link to the scheduler, and
    its registration is due 50 ms later, while the scheduler (forked at the same moment)
    may not serve yet: the beat waits for the link, and the worker is answered as soon as
    the scheduler serves. It was failed for want of a connection, and the worker waited
    out its reply timeout before it asked again: jobs whose workers were forked warm
    formed their first generation 5 s late."""
    port = free_tcp_port()
    sched = Scheduler(scheduler_config(tmp_path, port, worker_num=1))
    starter = threading.Timer(SCHEDULER_LATE, sched.run)
    server = BeatServer("h/0", "127.0.0.1", port, TOKEN, DEFAULT_RUN_ID, "", Timeouts())
    link = LocalLink(server.path, ANSWER_WITHIN, TOKEN)
    server.start()
    starter.start()
    try:
        reply = link.call(Op.REGISTER, node_id="0", pid=os.getpid(), incarnation=0,
                          host="h", rank=0, ready=True)
    finally:
        link.close()
        server.close()
        sched.request_stop("the test is over")
        starter.join(10)
    assert reply["ok"] and reply["rank"] == 0


NEWS_WITHIN = 0.5
"""Seconds from the scheduler's news to the node's beat that fetches it: half the second
at which a supervisor read the news counter before it waited for news instead."""


def test_news_reaches_the_node_at_once(tmp_path: Path) -> None:
    """An injection (news) is fetched by the node's next beat the moment the scheduler
    has it, not at the node's next read of the news counter (up to a second later), nor
    at its next spaced beat (6 s); and the supervisor is told (its scheduler watch takes
    a snapshot at once)."""
    port = free_tcp_port()
    sched = Scheduler(scheduler_config(tmp_path, port, worker_num=1))
    runner = threading.Thread(target=sched.run, daemon=True)
    runner.start()
    news = threading.Event()
    server = BeatServer("h/0", "127.0.0.1", port, TOKEN, DEFAULT_RUN_ID, "", Timeouts(),
                        on_news=news.set)
    worker = LocalLink(server.path, ANSWER_WITHIN, TOKEN)
    tftctl = SchedulerLink("127.0.0.1", port, TOKEN, ANSWER_WITHIN)
    identity = {"node_id": "0", "pid": os.getpid(), "incarnation": 0, "host": "h", "rank": 0}
    server.start()
    try:
        assert worker.call(Op.REGISTER, **identity, ready=True)["ok"]
        wait_for_event(tmp_path / "logs", 10, "the generation", event="generation")
        # The watch calls back at most once a spacing (a second): at its start (before
        # the registration), then with the generation's news up to a spacing later.
        # Two spacings after the generation, news is told the moment it comes.
        time.sleep(2 * Timeouts().heartbeat_interval + 0.2)
        assert tftctl.wait_connected(10)
        news.clear()
        asked = time.monotonic()
        assert tftctl.call(Op.INJECT, rank=0, fault="hang", at_step=100)["ok"]
        # The worker's own heartbeat: answered at once with the node's latest answer.
        while "inject" not in (answer := worker.call(Op.HEARTBEAT, **identity, step=1,
                                                     phase="train", ready=True)) \
                and time.monotonic() - asked < 10:
            time.sleep(0.01)
        fetched = time.monotonic() - asked
        told = news.wait(NEWS_WITHIN)
    finally:
        tftctl.close()
        worker.close()
        server.close()
        sched.request_stop("the test is over")
        runner.join(10)
    assert fetched < NEWS_WITHIN
    assert told
    assert [i["fault"] for i in answer.get("inject", [])] == ["hang"]
