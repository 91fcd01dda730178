"""At most one report per interval of something anyone may cause at any rate.

Anyone who reaches the scheduler's port can send requests it refuses; reporting each would let a
stranger fill the log volume, so each kind is counted and reported once per :data:`REPORT_EVERY`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Throttle", "REPORT_EVERY"]

REPORT_EVERY = 10.0


class Throttle:
    """Counts occurrences; says when (and how many) to report."""

    def __init__(self, every: float = REPORT_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._every = every
        self._clock = clock
        self._held = 0
        self._reported_at: float | None = None

    def note(self) -> int | None:
        """One more occurrence: how many to report now (this one included), else ``None``."""
        self._held += 1
        return self.due()

    def due(self) -> int | None:
        """The occurrences held back, when their report is due now; else ``None``."""
        now = self._clock()
        if self._held == 0 or (self._reported_at is not None
                               and now - self._reported_at < self._every):
            return None
        count, self._held, self._reported_at = self._held, 0, now
        return count

    def next_due(self) -> float | None:
        """When (on the clock) the held-back occurrences are to be reported; ``None``: none held."""
        if self._held == 0:
            return None
        return self._clock() if self._reported_at is None else self._reported_at + self._every
