"""The ``step`` events: where each rank's training is, for the live view and ``tftctl report``. Each is
a locked ``events.jsonl`` line, so the whole job's are kept near :data:`JOB_STEP_EVENTS_PER_SECOND` a
second; a rank that sees a fault writes its step at once, to count the steps redone."""

from __future__ import annotations

import time
from collections.abc import Callable

from recovery.events import EventLog

__all__ = ["StepEvents", "step_event_interval", "JOB_STEP_EVENTS_PER_SECOND", "STEP_EVENT",
           "STEADY", "PAUSED", "RESTORED"]

STEP_EVENT = "step"
STEADY, PAUSED, RESTORED = "interval", "paused", "restored"
"""The ``why`` of a step event: written while training goes on, when a fault stopped the
rank, when a rollback or a replica put it at its step."""
JOB_STEP_EVENTS_PER_SECOND = 8.0
"""About how many ``step`` events the whole job writes per second, once it has 8 ranks or
more; a smaller job writes one per rank and second."""


def step_event_interval(world_size: int) -> float:
    """Seconds between two ``step`` events of one rank of a ``world_size``-rank job."""
    return max(1.0, world_size / JOB_STEP_EVENTS_PER_SECOND)


class StepEvents:
    """Writes this rank's ``step`` events: ``step`` is the global step completed, ``total`` the steps
    the loop runs in all, ``batch`` the samples the last committed step trained job-wide (None when
    unknown). A speed is measured only between events of steady training."""

    def __init__(self, events: EventLog, rank: int, world_size: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total: int | None = None
        self.batch: int | None = None
        self._events = events
        self._rank = rank
        self._interval = step_event_interval(world_size)
        self._clock = clock
        self._next_at = 0.0

    def completed(self, global_step: int, generation: int) -> None:
        """``global_step`` is done: written if this rank wrote none for the interval."""
        if self._clock() >= self._next_at:
            self.reached(global_step, generation, STEADY)

    def reached(self, global_step: int, generation: int, why: str) -> None:
        """Write that this rank is at ``global_step`` now, whatever the interval."""
        self._next_at = self._clock() + self._interval
        self._events.emit(STEP_EVENT, rank=self._rank, step=global_step, total=self.total,
                          batch=self.batch, generation=generation, why=why)
