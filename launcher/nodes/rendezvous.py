"""A fresh c10d store for every restart of a plain ``env://`` script, since ``env://`` puts
no per-attempt prefix on its keys (docs/architecture.md). The port is bound before the
workers start and the server put on it by a background thread, so that the supervisor's loop
keeps watching while torch imports; an early client waits in the listen backlog.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from launcher.config import bind_listener

__all__ = ["RendezvousStore"]


class RendezvousStore:
    """Hosts the store that ``env://`` workers of the current restart meet at."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._sock: socket.socket | None = None
        self._store: Any = None
        self._server_thread: threading.Thread | None = None

    def open(self) -> int:
        """Close the previous restart's store, bind a new port and return it."""
        self.close()
        self._sock = bind_listener(self._host, 0)
        return self._sock.getsockname()[1]

    def serve(self, served: Callable[[], None] | None = None) -> None:
        """Start the store server on the bound socket from a background thread, which then
        calls ``served``."""
        if self._sock is None or self._server_thread is not None:
            return
        self._server_thread = threading.Thread(target=self._host_store,
                                               args=(self._sock, served),
                                               name="tftrun-rendezvous-store", daemon=True)
        self._server_thread.start()

    def _host_store(self, sock: socket.socket, served: Callable[[], None] | None) -> None:
        from torch.distributed import TCPStore

        self._store = TCPStore(
            self._host, sock.getsockname()[1], is_master=True, wait_for_workers=False,
            timeout=timedelta(seconds=60), master_listen_fd=sock.fileno(),
        )
        sock.detach()  # the store owns (and closes) the descriptor now
        if served is not None:
            served()

    def close(self) -> None:
        if self._server_thread is not None:
            self._server_thread.join()
            self._server_thread = None
        self._store = None
        if self._sock is not None:
            self._sock.close()  # nothing to close once detached to the store
            self._sock = None
