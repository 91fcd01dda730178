"""A fresh c10d store for every restart of a plain ``env://`` script.

torch's ``env://`` rendezvous with ``TORCHELASTIC_USE_AGENT_STORE=True`` puts no
per-attempt prefix on its keys: restarted gloo workers that meet in a reused store read
the previous attempt's addresses and fail in ``connectFullMesh`` (DESIGN.md §3; this is
how torchrun 2.13's restarts fail on this machine). So every restart gets a brand-new
store on a brand-new port, and the previous one is closed.

The port is bound (and listening) before the workers start, without importing torch;
the store's server is put on that socket afterwards, while the workers import torch.
A client that connects in between waits in the listen backlog and is served then.
"""

from __future__ import annotations

import socket
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

    def open(self) -> int:
        """Close the previous restart's store, bind a new port and return it."""
        self.close()
        self._sock = bind_listener(self._host, 0)
        return self._sock.getsockname()[1]

    def serve(self) -> None:
        """Start the store server on the bound socket (imports torch on first use)."""
        if self._sock is None or self._store is not None:
            return
        from torch.distributed import TCPStore

        port = self._sock.getsockname()[1]
        self._store = TCPStore(
            self._host, port, is_master=True, wait_for_workers=False,
            timeout=timedelta(seconds=60), master_listen_fd=self._sock.fileno(),
        )
        self._sock.detach()  # the store owns (and closes) the descriptor now
        self._sock = None

    def close(self) -> None:
        self._store = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
