"""The scheduler sleeps while nothing is due: no periodic ticks (issue 16, part 4), and
the deadline it sleeps until misses no verdict (Membership.next_due)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from recovery.control.members import Identity
from recovery.control.membership import Membership
from recovery.control.rpc import REQUESTS, open_client, reply_key
from recovery.timeouts import Timeouts
from support.fake_clock import FakeClock
from support.sched_inprocess import answer, running_scheduler, signed

IDLE_WINDOW = 1.0


def loop_counts(store: Any, rid: str) -> dict[str, int]:
    store.queue_push(REQUESTS, signed("status", rid=rid))
    store.wait([reply_key(rid)], timedelta(seconds=10))
    reply = answer(store.get(reply_key(rid)))
    assert reply["signed"], reply
    return reply["loop"]


def test_an_idle_scheduler_is_not_woken(tmp_path: Path, free_port: int) -> None:
    """No worker, nothing due for a minute (cluster_time_out): over IDLE_WINDOW the loop
    handles the second status request and nothing else (it ticked every 0.1 s before)."""
    with running_scheduler(tmp_path, free_port):
        store = open_client("127.0.0.1", free_port, 10)
        before = loop_counts(store, "before")
        time.sleep(IDLE_WINDOW)  # the quiet being measured: nothing to await
        after = loop_counts(store, "after")
    assert after["ticks"] - before["ticks"] == 0, (before, after)
    assert after["wakeups"] - before["wakeups"] == 1, (before, after)


@st.composite
def timelines(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """What 3 workers do, and time passing between the scheduler's checks."""
    node = st.sampled_from(["0", "1", "2"])
    return draw(st.lists(st.one_of(
        st.tuples(st.just("join"), node),
        st.tuples(st.just("beat"), node, st.integers(0, 4)),
        st.tuples(st.just("wait"), st.floats(0.01, 12.0)),
    ), max_size=25))


@settings(max_examples=150, deadline=None)
@given(timeline=timelines(), fraction=st.floats(0.0, 0.999))
@example(timeline=[("join", "0"), ("wait", 5.0)], fraction=0.5)  # a check exactly at a deadline
def test_checking_before_the_next_due_decides_nothing(timeline: list[tuple[Any, ...]],
                                                      fraction: float) -> None:
    """After any history checked as the scheduler checks it, a check anywhere before
    ``next_due`` decides nothing: sleeping until then misses no verdict. And a live member's
    silence is due no later than its heartbeat timeout."""
    clock = FakeClock()
    timeouts = Timeouts(rejoin_cooldown=0.0, cluster_time_out=20.0, heartbeat_timeout=5.0,
                        progress_timeout=3.0)
    ms = Membership(3, "t", timeouts, clock)
    incarnations = {"0": 0, "1": 0, "2": 0}
    for action, *args in timeline:
        if action == "join":
            incarnations[args[0]] += 1
            ms.register(Identity(args[0], 1, incarnations[args[0]], "h"), "t")
        elif action == "beat":
            ms.heartbeat(Identity(args[0], 1, incarnations[args[0]], "h"), "t", args[1])
        else:
            clock.advance(args[0])
        ms.check()
    ms.drain_events()
    now = clock.monotonic()
    due = ms.next_due(after=now)
    live_deadlines = [m.heartbeat_at + timeouts.heartbeat_timeout for m in ms.members.values()
                      if m.state.value in ("alive", "hung", "unconfirmed")]
    if any(deadline > now for deadline in live_deadlines):
        assert due is not None and due <= min(d for d in live_deadlines if d > now)
    if due is None:
        clock.advance(60.0 * fraction)
    else:
        clock.advance((due - now) * fraction)
    ms.check()
    assert ms.drain_events() == []
