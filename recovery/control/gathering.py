"""How long a batch of requests waits after its first one for others to join it.

Each batch costs the scheduler one wake-up, one run of the rules and one save, so where requests come
often a short wait gathers more into one. A quiet job, or one under :data:`GATHER_FROM_RANKS` ranks
(whose bursts are on its recovery path), is answered at once.
"""

from __future__ import annotations

__all__ = ["Gathering", "GATHER", "GATHER_FROM_RANKS", "for_ranks"]

GATHER = 0.025
"""Seconds a batch's first request waits for others at the most; small against the beat round trip's
latency target."""
GATHER_FROM_RANKS = 1024
"""The smallest job whose scheduler gathers, where the wake-ups start to cost."""
_WEIGHT = 0.2
"""The weight of the latest batch in the estimate of the gap between requests."""


class Gathering:
    """The gap between requests, estimated from batches, and the wait (at most ``window``) it calls for."""

    def __init__(self, window: float = GATHER) -> None:
        self.window = window
        self.gap: float | None = None
        """The estimated seconds between two requests (``None``: no batch yet)."""
        self._started = 0.0
        self._last: tuple[float, int] | None = None
        """The previous batch: when its first request came, and how many it had."""

    def wait(self, now: float, drained: bool = True) -> float:
        """A batch's first request came at ``now`` (monotonic): how long to wait for more. Nothing
        while requests are left waiting (not ``drained``): the batch fills anyway, and a wait would
        only slow a loop that is catching up. It updates :attr:`gap`."""
        if self._last is not None:
            started, requests = self._last
            latest = (now - started) / requests
            self.gap = latest if self.gap is None else (1 - _WEIGHT) * self.gap + _WEIGHT * latest
        self._started = now
        return self.window if drained and self.gap is not None and self.gap < self.window \
            else 0.0

    def handled(self, requests: int) -> None:
        """The batch whose first request came at the last :meth:`wait` had ``requests``."""
        self._last = (self._started, max(1, requests))


def for_ranks(worker_num: int) -> Gathering:
    """The gathering of a job of ``worker_num`` ranks: none (a window of 0) below
    :data:`GATHER_FROM_RANKS`."""
    return Gathering(GATHER if worker_num >= GATHER_FROM_RANKS else 0.0)
