"""A rank's compute time per step, the step's time less its wait in the collective; nothing is
synchronised for it. An injected ``slow`` fault sleeps in proportion to it (docs/fault-injection.md)."""

from __future__ import annotations

import time

__all__ = ["ComputeClock"]


class ComputeClock:
    """Marks of one step at a time; :meth:`finished` gives its compute time (seconds)."""

    def __init__(self) -> None:
        self.slowdown = 1.0
        self._started = 0.0
        self._waited = 0.0
        self._collective_from: float | None = None

    def start(self) -> None:
        self._started, self._waited, self._collective_from = time.monotonic(), 0.0, None

    def collective_started(self) -> None:
        now = time.monotonic()
        if self.slowdown > 1:
            time.sleep((self.slowdown - 1) * (now - self._started - self._waited))
            now = time.monotonic()
        self._collective_from = now

    def collective_ended(self) -> None:
        if self._collective_from is not None:
            self._waited += time.monotonic() - self._collective_from
            self._collective_from = None

    def finished(self) -> float:
        """The step's compute time: from :meth:`start` to now, less the collectives."""
        self.collective_ended()
        return time.monotonic() - self._started - self._waited
