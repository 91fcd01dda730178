"""Helpers for the news watch's tests: the watch's calls awaited with a timeout, and news
bumped as the scheduler does."""

from __future__ import annotations

import threading
import time

from torch.distributed import TCPStore

from recovery.control.rpc import NEWS, news_key

AT_ONCE = 0.5
"""Seconds within which news must reach the watch: half the second at which the counter
was read before, and far more than a store round trip."""


class Calls:
    """The watch's calls, with the moment of each, awaited with a timeout."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._came = threading.Condition()

    def __call__(self) -> None:
        with self._came:
            self.times.append(time.monotonic())
            self._came.notify_all()

    def wait_for(self, count: int, timeout: float) -> float:
        """When the ``count``-th call came (AssertionError if not within ``timeout``)."""
        with self._came:
            assert self._came.wait_for(lambda: len(self.times) >= count, timeout), \
                f"{len(self.times)} call(s), not {count}, within {timeout}s"
            return self.times[count - 1]


def bump(store: TCPStore) -> float:
    """What the scheduler does when it has news; when it did."""
    count = store.add(NEWS, 1)
    store.set(news_key(count), str(count))
    return time.monotonic()
