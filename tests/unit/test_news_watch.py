"""The news watch (recovery/control/news_watch.py) against torch's own TCPStore server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from torch.distributed import TCPStore

from recovery.control.news_watch import NewsWatch
from recovery.control.rpc import NEWS, adopt_client
from recovery.control.tcpstore_client import StoreError, TCPStoreClient
from support.news_watch import AT_ONCE, Calls, bump

pytestmark = pytest.mark.timeout(60)

SPACING = 0.2


@pytest.fixture
def watched(store: TCPStore) -> Iterator[tuple[NewsWatch, Calls]]:
    calls = Calls()
    watch = NewsWatch("127.0.0.1", store.port, calls, spacing=SPACING)
    watch.start()
    try:
        yield watch, calls
    finally:
        watch.close()


def test_news_wakes_the_watch_at_once(store: TCPStore, watched: tuple[NewsWatch, Calls]
                                      ) -> None:
    """The watch calls back once at the start (the counter read), then once per news, the
    moment its key is set: it waits on the store, it does not read the counter every
    second."""
    _watch, calls = watched
    calls.wait_for(1, 10)
    time.sleep(2 * SPACING)  # past the spacing: the watch waits on the store now
    for count in (2, 3):
        sent = bump(store)
        assert calls.wait_for(count, 10) - sent < AT_ONCE
        time.sleep(2 * SPACING)
    assert len(calls.times) == 3


def test_two_pieces_of_news_a_moment_apart_are_both_told_at_once(
        store: TCPStore, watched: tuple[NewsWatch, Calls]) -> None:
    """A death's shrink and its relaunched rank's grow come a fraction of a second apart
    (with ``--rejoin_cooldown=0``): the grow is not held back for a spacing."""
    _watch, calls = watched
    calls.wait_for(1, 10)
    time.sleep(3 * SPACING)  # a quiet while: the watch may tell two at once again
    first = bump(store)
    assert calls.wait_for(2, 10) - first < AT_ONCE
    second = bump(store)
    assert calls.wait_for(3, 10) - second < SPACING / 2


def test_a_flood_costs_one_call_per_spacing_and_none_is_lost(
        store: TCPStore, watched: tuple[NewsWatch, Calls]) -> None:
    """Keys set in a flood cost at most two calls at once, then one per spacing, and the
    last call comes after the last key."""
    _watch, calls = watched
    calls.wait_for(1, 10)
    time.sleep(3 * SPACING)
    started = time.monotonic()
    last = started
    while time.monotonic() - started < 4 * SPACING:
        last = bump(store)
        time.sleep(SPACING / 20)
    time.sleep(2 * SPACING)
    flood = [t for t in calls.times if t >= started]
    assert flood[0] - started < AT_ONCE and flood[-1] >= last
    assert len(flood) <= 2 + 6  # two at once, then one per spacing of the flood and after it
    assert all(later - earlier >= SPACING * 0.9 for earlier, later in zip(flood[1:], flood[3:]))


def test_a_counter_moved_without_its_key_is_seen_when_the_wait_is_rearmed(
        store: TCPStore) -> None:
    """A key removed by a stranger (or never set) holds news back for one ``rearm`` at
    most: the wait is cancelled and the counter read again."""
    calls = Calls()
    watch = NewsWatch("127.0.0.1", store.port, calls, spacing=0.05, rearm=0.5)
    watch.start()
    try:
        calls.wait_for(1, 10)
        time.sleep(0.2)
        moved = time.monotonic()
        store.add(NEWS, 1)  # no key
        assert calls.wait_for(2, 10) - moved < 0.5 + AT_ONCE
    finally:
        watch.close()


def test_close_ends_a_watch_blocked_on_the_store(store: TCPStore) -> None:
    calls = Calls()
    watch = NewsWatch("127.0.0.1", store.port, calls, spacing=0.01, rearm=60)
    watch.start()
    calls.wait_for(1, 10)
    time.sleep(0.2)  # blocked in its wait
    started = time.monotonic()
    watch.close()
    assert time.monotonic() - started < 2


def test_a_counter_that_is_not_a_number_is_read_every_spacing_until_it_is_reset(
        store: TCPStore) -> None:
    """A stranger's value in the counter: the watch has no key to wait for, so it reads
    the counter every spacing, as supervisors did before, and news after the scheduler's
    reset reaches it within a spacing, not a rearm."""
    calls = Calls()
    watch = NewsWatch("127.0.0.1", store.port, calls, spacing=0.1, rearm=1.0)
    watch.start()
    try:
        calls.wait_for(1, 10)
        store.set(NEWS, "not a number")  # no key: seen when the wait is rearmed
        calls.wait_for(2, 10)  # it moved (to something unreadable)
        time.sleep(1.5)  # past a rearm: from now on only the spacing can tell the reset
        store.delete_key(NEWS)  # the scheduler's reset, then its next news
        reset = bump(store)
        assert calls.wait_for(3, 10) - reset < 0.1 + AT_ONCE
    finally:
        watch.close()


@pytest.mark.parametrize("closed", [False, True])
def test_a_client_made_while_its_owner_closed_is_closed_not_adopted(
        store: TCPStore, closed: bool) -> None:
    """The news watch and the scheduler link make their clients in a thread of their own;
    one made while the owner was closed must not be kept (nothing would close it)."""
    client = TCPStoreClient("127.0.0.1", store.port, 5.0)
    taken: list[TCPStoreClient] = []
    shut = threading.Event()
    if closed:
        shut.set()
    assert adopt_client(threading.Lock(), shut, client, taken.append) is not closed
    assert taken == ([] if closed else [client])
    if closed:
        with pytest.raises(StoreError):
            client.check([NEWS])
    else:
        assert client.check([NEWS]) is False
        client.close()
