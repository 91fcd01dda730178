"""SchedulerLink.wait_closed: whether a closed link's connecting thread is still blocked in
torch's store client, which only the scheduler serving its port again can release."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import psutil
import pytest
from support import wait_for

from recovery.control.rpc import SchedulerLink

pytestmark = pytest.mark.timeout(60)


@contextmanager
def unserved_port() -> Iterator[socket.socket]:
    """A listening socket nobody accepts on: the scheduler's port while tftrun relaunches it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock


def connections_to(port: int) -> set[tuple[str, int]]:
    """This process's established connections to ``port``, by local address."""
    return {tuple(c.laddr) for c in psutil.Process().net_connections("tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED}


def test_a_closed_link_blocked_on_an_unserved_port_reports_it_until_the_port_is_served() -> None:
    from torch.distributed import TCPStore

    with unserved_port() as sock:
        port = sock.getsockname()[1]
        link = SchedulerLink("127.0.0.1", port, "token", reply_timeout=1.0)
        seen: set[tuple[str, int]] = set()

        def client_waiting() -> bool:
            """A connection seen twice: a store client waiting for an answer (a port
            probe closes its own at once)."""
            now = connections_to(port)
            lasting = now & seen
            seen.update(now)
            return bool(lasting)

        wait_for(client_waiting, 30, "the link's client waiting on the port", interval=0.1)
        link.close()
        assert not link.wait_closed(0.5)
        server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=10), master_listen_fd=os.dup(sock.fileno()))
        assert link.wait_closed(10)
        assert not link.wait_connected(0)  # the client it made after close() is dropped
        del server


def test_a_closed_link_to_a_port_nobody_listens_on_ends_at_once(free_port: int) -> None:
    link = SchedulerLink("127.0.0.1", free_port, "token", reply_timeout=1.0)
    assert not link.wait_connected(0.3)
    link.close()
    assert link.wait_closed(2.0)
