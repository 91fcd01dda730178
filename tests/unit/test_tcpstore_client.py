"""The plain-Python store client against torch's own TCPStore server and client."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed import TCPStore

from recovery.control.tcpstore_client import StoreError, StoreTimeout, TCPStoreClient, ValueTooLarge

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server() -> Iterator[TCPStore]:
    """A real store server (libuv, torch's default), and torch's client of it."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=10))
    yield store
    del store


@pytest.fixture(scope="module")
def client(server: TCPStore) -> Iterator[TCPStoreClient]:
    """One connection for the module: each new one costs the server a reverse DNS lookup of
    the client, seconds where no resolver answers (as in this sandbox, docs/scale.md)."""
    connection = TCPStoreClient("127.0.0.1", server.port, timeout=5.0)
    yield connection
    connection.close()


KEYS = st.text(min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(key=KEYS, value=st.binary(max_size=3000))
def test_a_value_set_by_either_client_is_read_alike_by_both(server: TCPStore,
                                                            client: TCPStoreClient, key: str,
                                                            value: bytes) -> None:
    client.set(f"ours/{key}", value)
    assert server.get(f"ours/{key}") == value
    server.set(f"torch/{key}", value)
    assert client.get(f"torch/{key}", len(value)) == value
    assert client.check([f"ours/{key}", f"torch/{key}"])
    assert not client.check([f"ours/{key}", f"unset/{key}"])


def test_counters_and_compare_set_agree_with_torchs_client(server: TCPStore,
                                                          client: TCPStoreClient) -> None:
    assert client.add("counter", 5) == 5
    assert server.add("counter", 2) == 7
    assert client.add("counter", 0) == 7
    assert client.compare_set("cas", "", "first", 64) == b"first"  # unset: set
    assert client.compare_set("cas", "other", "second", 64) == b"first"  # mismatch: kept
    assert client.compare_set("cas", "first", "second", 64) == b"second"
    assert server.get("cas") == b"second"


def test_a_pushed_request_is_what_torchs_client_pops(server: TCPStore,
                                                     client: TCPStoreClient) -> None:
    client.queue_push("queue", b"one")
    client.queue_push("queue", b"two")
    assert [server.queue_pop("queue"), server.queue_pop("queue")] == [b"one", b"two"]


def test_a_deleted_key_is_gone_and_deleting_it_again_says_so(server: TCPStore,
                                                            client: TCPStoreClient) -> None:
    server.set("doomed", "x")
    assert client.delete_key("doomed")
    assert not client.check(["doomed"])
    assert not client.delete_key("doomed")


def test_get_waits_for_a_key_set_later(server: TCPStore, client: TCPStoreClient) -> None:
    setter = threading.Timer(0.3, lambda: server.set("late", "here"))
    setter.start()
    try:
        assert client.get("late", 4) == b"here"
    finally:
        setter.join()


def test_get_of_a_key_never_set_times_out_and_the_connection_is_spent(server: TCPStore) -> None:
    ours = TCPStoreClient("127.0.0.1", server.port, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(StoreTimeout):
        ours.get("never", 1)
    assert time.monotonic() - started < 3
    with pytest.raises(StoreError):
        ours.check(["never"])


def test_a_listening_port_nobody_serves_is_refused_within_the_timeout() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        started = time.monotonic()
        with pytest.raises(StoreTimeout):
            TCPStoreClient("127.0.0.1", sock.getsockname()[1], timeout=0.3)
        assert time.monotonic() - started < 3


def test_a_port_nobody_listens_on_is_refused_at_once(free_port: int) -> None:
    with pytest.raises(StoreError):
        TCPStoreClient("127.0.0.1", free_port, timeout=5.0)


def test_a_value_announced_longer_than_the_caller_takes_is_not_read(server: TCPStore) -> None:
    """Anyone may set a key to megabytes: the length is checked before anything is
    allocated, and the connection (now mid-value) is dropped."""
    server.set("huge", b"x" * 100_000)
    ours = TCPStoreClient("127.0.0.1", server.port, timeout=5)
    with pytest.raises(ValueTooLarge, match="100000 bytes"):
        ours.get("huge", 65_536)
    with pytest.raises(StoreError):
        ours.check(["huge"])


def test_wait_returns_at_once_for_keys_already_set(server: TCPStore,
                                                   client: TCPStoreClient) -> None:
    server.set("here/1", "x")
    server.set("here/2", "y")
    started = time.monotonic()
    assert client.wait(["here/1", "here/2"], timeout=5.0)
    assert time.monotonic() - started < 2


def test_wait_wakes_when_the_last_key_is_set_by_torchs_client(server: TCPStore,
                                                              client: TCPStoreClient) -> None:
    server.set("some/1", "x")
    setter = threading.Timer(0.3, lambda: server.set("some/2", "y"))
    started = time.monotonic()
    setter.start()
    try:
        assert client.wait(["some/1", "some/2"], timeout=30.0)
    finally:
        setter.join()
    assert 0.2 < time.monotonic() - started < 10


def test_a_wait_that_times_out_is_cancelled_and_the_connection_stays_usable(
        server: TCPStore, client: TCPStoreClient) -> None:
    """Torch's server keeps a client's wait until its keys come or it cancels it
    (CANCEL_WAIT): after a timeout the store must not answer the old wait later, in the
    middle of another operation's answer."""
    started = time.monotonic()
    assert not client.wait(["cancelled/1"], timeout=0.2)
    assert 0.15 < time.monotonic() - started < 5
    server.set("cancelled/1", "now")  # a STOP_WAITING for the old wait would come now
    assert client.add("after-cancel", 3) == 3
    assert client.get("cancelled/1", 8) == b"now"
    assert client.wait(["cancelled/1"], timeout=1.0)
