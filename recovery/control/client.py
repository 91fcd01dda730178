"""The supervisor's handle on the scheduler: report exits and retirements, read the status.

No method blocks much past ``timeout`` seconds. While the scheduler is down, or a reply is forged or
malformed, reports are queued and resent in order under their request ids (so each counts once) and a
status read is ``None``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from typing import Any

from recovery import env as names
from recovery.control.rpc import Op, SchedulerLink, SchedulerUnavailable, new_request_id

__all__ = ["SchedulerControl", "ExitReport", "Retirement"]

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


@dataclass(frozen=True)
class Retirement:
    """Ranks a supervisor retired for good (degraded training, docs/elastic.md)."""

    ranks: list[int]
    reason: str


class SchedulerControl:
    """The supervisor's link to the scheduler at ``host:port`` (``MS_SCHED_HOST``, ``MS_SCHED_PORT``).
    ``token``, ``run_id`` and ``epoch`` make the job's signing key; ``timeout``: seconds one request
    may wait for its answer; not ``connect``: connect at :meth:`connect`."""

    def __init__(self, host: str, port: int, token: str, timeout: float = 1.0,
                 connect: bool = True,
                 run_id: str = names.DEFAULT_RUN_ID, epoch: str = "") -> None:
        self._pending: list[tuple[str, ExitReport | Retirement]] = []  # with its request id
        self._lock = threading.Lock()
        self._link = SchedulerLink(host, port, token, timeout, on_connect=self._flush,
                                   connect=connect, run_id=run_id, epoch=epoch)

    def connect(self) -> None:
        """Start connecting in the background (a ``connect=False`` handle); idempotent."""
        self._link.start()

    def report(self, report: ExitReport | Retirement) -> None:
        """A worker process ended (an abnormal exit starts the cooldown for its node id), or ranks were
        retired for good (the scheduler awaits them no more until they register again, and records a
        ``membership`` event)."""
        with self._lock:
            self._pending.append((new_request_id(), report))
        self._flush()

    def status(self) -> dict[str, Any] | None:
        """The membership table (as ``tftctl status`` shows it), or ``None`` when down."""
        return self._call(Op.STATUS)

    def node_status(self, first_rank: int, nproc: int, missing: bool) -> dict[str, Any] | None:
        """The rows of ranks ``first_rank`` to ``first_rank + nproc - 1`` and the job's facts (with
        ``missing``, the missing ranks); ``None`` when down."""
        return self._call(Op.STATUS, first_rank=first_rank, nproc=nproc, missing=missing)

    def close(self) -> None:
        """Stop talking to the scheduler; reports not delivered yet are dropped."""
        self._link.close()
        with self._lock:
            if self._pending:
                logger.warning("%d exit reports were not delivered to the scheduler",
                               len(self._pending))
            self._pending.clear()

    def _call(self, op: Op, **fields: Any) -> dict[str, Any] | None:
        """Deliver queued reports first, then ask; ``None`` when the scheduler is down."""
        if not self._flush():
            return None
        try:
            reply = self._link.call(op, **fields)
        except SchedulerUnavailable:
            return None
        if not reply.get("ok"):
            logger.warning("the scheduler refused %s: %s", op.value, reply.get("message"))
            return None
        return reply

    def _flush(self) -> bool:
        """Deliver the queued reports, oldest first; True when none is left."""
        with self._lock:
            while self._pending:
                rid, report = self._pending[0]
                try:
                    if isinstance(report, ExitReport):
                        reply = self._link.call(Op.EXIT, rid=rid, **asdict(report))
                    else:
                        reply = self._link.call(Op.RETIRE, rid=rid, retired=report.ranks,
                                                reason=report.reason)
                except SchedulerUnavailable:
                    return False
                self._pending.pop(0)
                if not reply.get("ok"):
                    logger.warning("the scheduler refused %s: %s", report, reply.get("message"))
            return True
