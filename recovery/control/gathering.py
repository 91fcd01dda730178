"""How long a batch of requests waits after its first one for others to join it.

The scheduler handles the requests waiting in its queue as one batch (one run of the
rules, one save, one write of events). Where beats come one at a time, each batch is
one beat, and the loop pays for waking (a store round trip to wait for the request,
one to count those waiting, a cache gone cold) once per beat: in a large job most of a
``node_beat``'s cost (docs/scale.md). Waiting a little after the first request gathers
the ones that come meanwhile into the same batch.

The wait is only worth it where requests come often: it is :data:`GATHER` where at
least one more request is expected within it (the mean gap between requests, estimated
over recent batches, is shorter), nothing otherwise, so a quiet job's requests (a few a
second) are answered at once; nor while the queue is not drained (a backlog
fills batches without it). A request never waits for others longer than :data:`GATHER`.

A job of fewer than :data:`GATHER_FROM_RANKS` ranks never gathers: its beats come 47 ms
apart or more at the defaults, so only its bursts would (the registrations of a
generation, the requests of a recovery), and those are on the path of its recovery time.
"""

from __future__ import annotations

__all__ = ["Gathering", "GATHER", "GATHER_FROM_RANKS", "for_ranks"]

GATHER = 0.025
"""Seconds a batch's first request waits for others at the most: a small part of the
beat round trip's targets (p99 under 100 ms at 8192 ranks)."""
GATHER_FROM_RANKS = 1024
"""The smallest job whose scheduler gathers: 1024 ranks beat about 21 times a second (a
beat per node of 8 every 6 s), where the waking starts to cost."""
_WEIGHT = 0.2
"""The weight of the latest batch in the estimate of the gap between requests."""


class Gathering:
    """The gap between requests, estimated from batches, and the wait it calls for.

    Args:
        window: the longest wait (:data:`GATHER`).
    """

    def __init__(self, window: float = GATHER) -> None:
        self.window = window
        self.gap: float | None = None
        """The estimated seconds between two requests (``None``: no batch yet)."""
        self._started = 0.0
        self._last: tuple[float, int] | None = None
        """The previous batch: when its first request came, and how many it had."""

    def wait(self, now: float, drained: bool = True) -> float:
        """A batch's first request came at ``now`` (monotonic): how long to wait for more.
        Nothing while requests are left waiting (``drained`` false: the previous batch
        was full): the batch fills without it, and a wait would only slow the loop that
        is catching up (seen at 65 536 ranks: behind for minutes, every node judged).

        The requests that came since the previous batch's first one are the rest of that
        batch and this one's first: their mean gap is the latest estimate."""
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
