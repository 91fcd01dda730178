"""A clock the membership rules read (``time`` and ``monotonic``) that moves only when a
test says so: verdicts and cooldowns become exact and instant to test."""

from __future__ import annotations

T0 = 1_700_000_000.0
"""The wall time a FakeClock starts at."""


class FakeClock:
    def __init__(self) -> None:
        self.wall = T0
        self.mono = 100.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds
