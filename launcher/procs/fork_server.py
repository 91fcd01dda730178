"""The supervisor's end of the node's fork server: workers, and node 0's scheduler, forked from one
interpreter that imported torch once (launcher/procs/fork_server_main.py, docs/cli.md#the-fork-server).
Forked workers are re-parented to the supervisor (a child subreaper), which reaps them; without the server,
workers start cold."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
from collections.abc import Callable
from typing import Any

from launcher.procs.fork_server_main import MAX_MESSAGE, READY
from launcher.procs.process import Adopted, Child, open_log
from launcher.procs.spec import ProcessSpec

__all__ = ["ForkServer", "WARM_TIMEOUT", "REPLY_TIMEOUT"]

logger = logging.getLogger(__name__)

WARM_TIMEOUT = 60.0
"""Seconds the first fork waits for the server to be warm (its ``import torch``)."""
REPLY_TIMEOUT = 10.0
"""Seconds a fork waits for the server's answer (two ``fork`` calls) before giving up on it."""


class ForkServer:
    """The supervisor's end of the fork server; ``start(fd)`` starts the server on its end of a socket pair."""

    def __init__(self, start: Callable[[int], Child]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.child: Child = start(theirs.fileno())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock: socket.socket | None = ours
        self._warm = False
        self._ended = False
        """The server closed its end: it exited (its import failed, or it was killed)."""

    def fork(self, spec: ProcessSpec, message: dict[str, Any], header: str,
             fds: dict[str, int] | None = None) -> Child | None:
        """Fork ``spec``'s process to run ``message`` (script or module, arguments); None when the server
        cannot, and the caller starts it cold. ``fds``: open files passed on, each named to the process by
        the environment variable that is its key. OSError when the fork failed, as a failed spawn would.
        """
        if not self.ready():
            return None
        with open_log(spec.log_path, header):
            pass
        fds = fds or {}
        request = {**message, "env": dict(spec.env), "cwd": os.getcwd(),
                   "log": str(spec.log_path), "fd_env": list(fds)}
        reply = self._ask(request, list(fds.values()))
        if reply is None:
            return None
        if "pid" not in reply:
            raise OSError(str(reply.get("error", reply)))
        return Child(Adopted(int(reply["pid"])))

    def close(self) -> Child:
        """Close the socket (the server reads EOF and ends); the server's Child, to reap."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        return self.child

    def ready(self) -> bool:
        """Whether the server is warm; the first call waits for it, since a worker started cold meanwhile
        would pay the same import on the same cores."""
        if self._warm:
            return self._sock is not None
        reply = self._receive(WARM_TIMEOUT)
        self._warm = reply is not None and READY in reply
        if not self._warm:
            self._lose("it ended before it was ready (its log, fork_server.log, says why)"
                       if self._ended else f"it was not ready within {WARM_TIMEOUT:.0f} s")
        return self._warm

    def _ask(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any] | None:
        assert self._sock is not None
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
        except OSError as err:
            self._lose(f"it is gone ({err})")
            return None
        reply = self._receive(REPLY_TIMEOUT)
        if reply is None:
            self._lose("it ended" if self._ended
                       else f"it did not answer within {REPLY_TIMEOUT:.0f} s")
        return reply

    def _receive(self, timeout: float) -> dict[str, Any] | None:
        """The server's next message; None at EOF, after ``timeout``, or once the socket is closed."""
        if self._sock is None:
            return None
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(MAX_MESSAGE)
        except OSError:
            return None
        self._ended = not data
        return json.loads(data) if data else None

    def _lose(self, why: str) -> None:
        """Give up on the server for the rest of the job: workers start cold from now on."""
        logger.warning("tftrun: the fork server (pid %d) is not used: %s; workers start "
                       "as fresh processes", self.child.pid, why)
        self.close()
        self.child.signal_group(signal.SIGKILL)
