"""A survivor tells the scheduler at once that a collective failed on a peer, so that a
lost node is judged quickly (recovery/control/peer_reports.py), not after the heartbeat
timeout. Sent from a thread of its own: the survivor never waits for it."""

from __future__ import annotations

import logging
import threading

from recovery.control.rpc import Op, SchedulerLink, SchedulerUnavailable

__all__ = ["report_peer_failure"]

logger = logging.getLogger(__name__)


def report_peer_failure(link: SchedulerLink, rank: int, generation: int, cause: str) -> None:
    """Send a ``peer_failed`` request for ``cause`` (the collective's error) in the background."""

    def send() -> None:
        try:
            link.call(Op.PEER_FAILED, rank=rank, generation=generation, cause=cause[:4096])
        except SchedulerUnavailable as err:  # the heartbeat timeout still judges the peer
            logger.debug("peer failure not reported: %s", err)

    threading.Thread(target=send, name="peer-failed", daemon=True).start()
