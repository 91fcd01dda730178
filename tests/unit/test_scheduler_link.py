"""SchedulerLink's connection: made in the background, never stuck on a port that is
listening but not served (the scheduler's while tftrun relaunches it); without torch:
tests/integration/test_scheduler_link_without_torch.py."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from recovery.control.rpc import SchedulerLink
from support import wait_for

pytestmark = pytest.mark.timeout(60)


@contextmanager
def unserved_port() -> Iterator[socket.socket]:
    """A listening socket nobody accepts on: the scheduler's port while tftrun relaunches it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock


def link_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tft-scheduler-link"]


def test_a_link_waiting_on_an_unserved_port_connects_once_a_store_serves_it() -> None:
    with unserved_port() as sock:
        port = sock.getsockname()[1]
        link = SchedulerLink("127.0.0.1", port, "token", reply_timeout=0.5)
        try:
            assert not link.wait_connected(1.5)  # attempts time out, and are made again
            server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=10),
                              master_listen_fd=os.dup(sock.fileno()))
            assert link.wait_connected(10)
            assert link.news() == 0
            server.add("tft/news", 3)
            assert link.news() == 3
        finally:
            link.close()
        del server


def test_a_closed_link_on_an_unserved_port_stops_trying_within_a_reply_timeout() -> None:
    before = set(link_threads())
    with unserved_port() as sock:
        link = SchedulerLink("127.0.0.1", sock.getsockname()[1], "token", reply_timeout=0.5)
        wait_for(lambda: set(link_threads()) - before, 10, "the link's connecting thread")
        link.close()
        wait_for(lambda: not set(link_threads()) - before, 5,
                 "the closed link's connecting thread to end")
    assert not link.wait_connected(0)


def test_a_thread_waiting_for_a_connection_returns_soon_after_the_link_is_closed() -> None:
    """tftrun's beat thread waits here for the scheduler it beats to; after the job's end
    (the scheduler stopped) it held tftrun's exit for the whole wait, 3 s of every job."""
    with unserved_port() as sock:
        link = SchedulerLink("127.0.0.1", sock.getsockname()[1], "token", reply_timeout=0.5)
        returned: list[bool] = []
        waiter = threading.Thread(target=lambda: returned.append(link.wait_connected(30.0)))
        waiter.start()
        link.close()
        waiter.join(2.0)
        assert not waiter.is_alive() and returned == [False]
