"""A worker's end of its node's beat socket: registers and heartbeats go to the supervisor.

Under tftrun (``TFT_BEAT_SOCKET``) a Unix ``SOCK_SEQPACKET`` socket lets the supervisor see the moment
the process ends and batch beats into one ``node_beat`` per node; the rest goes to the scheduler.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from recovery.control.node_beats import MAX_LOCAL_BYTES, decode, encode
from recovery.control.rpc import NoReply, Op, SchedulerUnavailable
from recovery.control.signing import local_proof

__all__ = ["LocalLink"]


class LocalLink:
    """The connection to the node's supervisor at ``path``, for what a
    :class:`recovery.control.rpc.SchedulerLink` does for registrations and heartbeats. Each request
    proves ``token``, so a worker started with another job's token is refused for good."""

    def __init__(self, path: str, reply_timeout: float, token: str) -> None:
        self.path = path
        self._proof = local_proof(token)
        self._reply_timeout = reply_timeout
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    @property
    def where(self) -> str:
        return f"the node's supervisor at {self.path}"

    def wait_connected(self, timeout: float) -> bool:
        """Whether the supervisor's socket can be reached (connects if need be)."""
        with self._lock:
            return self._connected() is not None

    def call(self, op: Op, rid: str | None = None, **fields: Any) -> dict[str, Any]:
        """Send a registration or a heartbeat; the supervisor's answer. Raises SchedulerUnavailable
        when the supervisor cannot be reached or has no answer yet (:class:`NoReply`: none in time)."""
        reply = self._ask({"op": op.value, **fields, "proof": self._proof})
        if "ok" not in reply:
            raise SchedulerUnavailable(f"no answer from the scheduler yet ({self.where})")
        return reply

    def news(self) -> int | None:
        """The supervisor's news counter; ``None`` when it cannot be read now."""
        try:
            news = self._ask({"op": "news"}).get("news")
        except SchedulerUnavailable:
            return None
        return news if isinstance(news, int) else None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            sock = self._connected()
            if sock is None:
                raise SchedulerUnavailable(f"cannot reach {self.where}")
            try:
                sock.sendall(encode(message))
                data = sock.recv(MAX_LOCAL_BYTES)
            except TimeoutError:
                self._drop()  # an answer may still come: never read as the next one's
                raise NoReply(f"no answer from {self.where} within "
                              f"{self._reply_timeout:g}s") from None
            except OSError as err:
                self._drop()
                raise SchedulerUnavailable(f"{self.where}: {err}") from None
            reply = decode(data) if data else None
            if reply is None:
                self._drop()
                raise SchedulerUnavailable(f"{self.where} closed the connection or answered "
                                           "something else")
        return reply

    def _connected(self) -> socket.socket | None:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.settimeout(self._reply_timeout)
            try:
                sock.connect(self.path)
            except OSError:
                sock.close()
                return None
            self._sock = sock
        return self._sock

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
