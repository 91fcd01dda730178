"""Batches gathered for a short window where requests come often (docs/scale.md): every
request still answered, none kept waiting for others past the window, and a quiet job's
requests not kept waiting at all."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

from recovery.control.gathering import GATHER, GATHER_FROM_RANKS, Gathering, for_ranks
from recovery.control.rpc import REQUESTS, open_client, reply_key
from support.sched_inprocess import answer, running_scheduler, signed


def batches(gathering: Gathering, gaps: list[float], per_batch: int = 1) -> list[float]:
    """The waits asked for when batches of ``per_batch`` begin ``gaps`` apart."""
    now, waits = 0.0, []
    for gap in gaps:
        now += gap
        waits.append(gathering.wait(now))
        gathering.handled(per_batch)
    return waits


def test_a_quiet_job_waits_for_nobody() -> None:
    assert batches(Gathering(), [1.0] * 50) == [0.0] * 50


def test_frequent_requests_are_gathered_for_the_window_at_most() -> None:
    gathering = Gathering()
    waits = batches(gathering, [0.005] * 20)
    assert waits[0] == 0.0  # nothing known yet
    assert waits[-1] == GATHER
    assert max(waits) <= GATHER
    # Gathered batches of 6 every 30 ms: still 5 ms between requests, still gathered.
    assert batches(gathering, [0.030] * 20, per_batch=6) == [GATHER] * 20


def test_gathering_stops_once_requests_thin_out() -> None:
    gathering = Gathering()
    batches(gathering, [0.005] * 20)
    assert batches(gathering, [2.0] * 3)[-1] == 0.0


def test_a_backlog_is_not_waited_for() -> None:
    """While batches are full (requests left waiting), the loop catches up without
    pausing: a 25 ms wait per batch of 256 cost a fifth of its pace, and at 65 536 ranks
    it stayed behind for minutes."""
    gathering = Gathering()
    batches(gathering, [0.005] * 20)  # the last began at 0.1
    assert gathering.wait(0.105, drained=False) == 0.0
    gathering.handled(256)
    assert gathering.wait(0.110, drained=True) == GATHER  # drained again: gathered again


def burst_wakeups(tmp_path: Path, port: int, worker_num: int) -> int:
    """The loop's wake-ups for 200 status requests sent 2 ms apart to the scheduler of a
    job of ``worker_num`` ranks, every one answered."""
    with running_scheduler(tmp_path, port, worker_num) as scheduler:
        store = open_client("127.0.0.1", port, 10)
        before = scheduler.wakeups
        rids = [f"burst-{i}" for i in range(BURST)]
        for rid in rids:
            store.queue_push(REQUESTS, signed("status", rid=rid))
            time.sleep(0.002)  # the pace of the load, not a wait for anything
        for rid in rids:
            store.wait([reply_key(rid)], timedelta(seconds=10))
            assert answer(store.get(reply_key(rid)))["ok"], rid
        return scheduler.wakeups - before


BURST = 200


def test_a_burst_is_answered_in_few_batches(tmp_path: Path, free_port: int) -> None:
    """In a large job, 200 requests 2 ms apart: every one answered, in far fewer wake-ups
    of the loop than requests (without gathering, each came to an idle loop: a wake-up
    each)."""
    woken = burst_wakeups(tmp_path, free_port, GATHER_FROM_RANKS)
    assert woken < BURST / 3, woken


def test_a_small_job_never_gathers() -> None:
    """Below GATHER_FROM_RANKS the window is 0: a burst's requests wait for nobody."""
    assert batches(for_ranks(GATHER_FROM_RANKS - 1), [0.005] * 20) == [0.0] * 20
    assert batches(for_ranks(GATHER_FROM_RANKS), [0.005] * 20)[-1] == GATHER
