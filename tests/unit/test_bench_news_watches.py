"""The scale bench's news watches (bench/news_watches.py), many in one thread, behave as
the supervisor's NewsWatch against torch's own TCPStore: a call at the start, news told
at once to every node, a counter moved without its key seen at the next rearm."""

from __future__ import annotations

import sys
import time

import pytest
from torch.distributed import TCPStore

from recovery.control.rpc import NEWS
from support import REPO
from support.news_watch import AT_ONCE, Calls, bump

sys.path.insert(0, str(REPO / "bench"))
from news_watches import NewsWatches  # noqa: E402 - bench/ is not a package

pytestmark = pytest.mark.timeout(60)

NODES = 50


def test_news_reaches_every_node_at_once(store: TCPStore) -> None:
    watches = NewsWatches("127.0.0.1", store.port, spacing=0.05)
    watches.start()
    nodes = [Calls() for _ in range(NODES)]
    try:
        for calls in nodes:
            watches.watch(calls)
        for calls in nodes:
            calls.wait_for(1, 10)  # connected, the counter read
        bumped = bump(store)
        assert all(calls.wait_for(2, 10) - bumped < AT_ONCE for calls in nodes)
    finally:
        watches.close()


def test_a_counter_moved_without_its_key_is_seen_when_the_wait_is_rearmed(
        store: TCPStore) -> None:
    watches = NewsWatches("127.0.0.1", store.port, spacing=0.05, rearm=0.5)
    watches.start()
    calls = Calls()
    try:
        watches.watch(calls)
        calls.wait_for(1, 10)
        time.sleep(0.2)  # past the spacing: the watch waits for the next key
        moved = time.monotonic()
        store.add(NEWS, 1)  # no key set: only a reading of the counter finds it
        # When the wait that began after the spacing is cancelled and rearmed.
        assert 0.5 <= calls.wait_for(2, 10) - calls.times[0]
        assert calls.times[1] - moved < 0.5 + AT_ONCE
    finally:
        watches.close()
