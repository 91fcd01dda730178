"""Which scheduler ``tftctl`` talks to, and the token it signs its requests with. A log dir may be shared, so
``DIR/scheduler.json`` is trusted only if the file is the user's own, and the pid it names is the user's, is the
scheduler of the file's run id and listens on its port; the token and epoch are then read from that process's
environment, and the token is never sent."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from recovery.control.files import ENDPOINT_FILE, Endpoint
from recovery.env import WorkerEnv

__all__ = ["TrustedEndpoint", "trusted_endpoint", "UntrustedEndpoint"]


class UntrustedEndpoint(LookupError):
    """No scheduler of the user's own job is found in the log dir (the reason says why)."""


@dataclass(frozen=True)
class TrustedEndpoint:
    endpoint: Endpoint
    token: str = field(repr=False)
    epoch: str = ""
    """The launch's epoch, from the same environment."""


def trusted_endpoint(log_dir: Path) -> TrustedEndpoint:
    """The scheduler serving the job of ``log_dir``, checked as the module says; UntrustedEndpoint if none
    belongs to the job."""
    path = Path(log_dir) / ENDPOINT_FILE
    try:
        info = path.stat()
    except OSError:
        raise UntrustedEndpoint(f"no {ENDPOINT_FILE}") from None
    if info.st_uid != os.getuid():
        raise UntrustedEndpoint(f"{path} is not yours (owner uid {info.st_uid})")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedEndpoint(f"{path} is writable by others")
    endpoint = Endpoint.read(log_dir)
    if endpoint is None:
        raise UntrustedEndpoint(f"{path} is unreadable")
    seen = _scheduler_env(endpoint)
    if seen.run_id != endpoint.run_id or not seen.is_scheduler:
        raise UntrustedEndpoint(f"pid {endpoint.pid} is not the scheduler of job "
                                f"{endpoint.run_id}")
    if not _listens(endpoint.pid, endpoint.port):
        raise UntrustedEndpoint(f"pid {endpoint.pid} does not listen on port {endpoint.port}")
    return TrustedEndpoint(endpoint, seen.job_token, seen.epoch)


def _scheduler_env(endpoint: Endpoint) -> WorkerEnv:
    try:
        process = psutil.Process(endpoint.pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            raise UntrustedEndpoint(f"its scheduler (pid {endpoint.pid}) has ended")
        if process.uids().real != os.getuid():
            raise UntrustedEndpoint(f"pid {endpoint.pid} is not yours")
        return WorkerEnv.from_env(process.environ())
    except psutil.NoSuchProcess:
        raise UntrustedEndpoint(f"its scheduler (pid {endpoint.pid}) has ended") from None
    except (psutil.Error, ValueError) as err:
        raise UntrustedEndpoint(f"cannot read the environment of pid {endpoint.pid}: "
                                f"{err}") from None


def _listens(pid: int, port: int) -> bool:
    try:
        sockets = psutil.Process(pid).net_connections(kind="inet")
    except psutil.Error:
        return False
    return any(s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port
               for s in sockets)
