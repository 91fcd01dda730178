"""Who computes which samples of a step, for any set of live ranks: the pure core of degraded training
(docs/elastic.md), with no I/O and no torch. An epoch's samples are cut into numbered *micro-batches* of
``batch_size``; the *cursor* counts those committed steps trained, so a voided step is planned again
from the same cursor."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BatchPolicy", "StepPlan", "plan_step", "steps_left"]


class BatchPolicy(enum.StrEnum):
    """How many samples a step trains when ranks are missing."""

    CONSTANT = "constant"
    """Always ``worker_num`` micro-batches: the live ranks compute the lost ones too, so the update is
    the full job's, only summed in another order."""
    SHRINK = "shrink"
    """One micro-batch per live rank (torchft's behaviour): the global batch shrinks with the membership."""


@dataclass(frozen=True)
class StepPlan:
    """One step's work: ``shares`` maps each live rank to its micro-batches, ascending, from ``cursor`` on.
    The share-weighted gradient sum is divided by :attr:`divisor`, the micro-batches the step trains (never
    the number of live ranks)."""

    cursor: int
    shares: dict[int, tuple[int, ...]]

    @property
    def divisor(self) -> int:
        """Micro-batches this step trains: how far the cursor moves when it commits."""
        return sum(len(share) for share in self.shares.values())

    @property
    def next_cursor(self) -> int:
        """The cursor once this step commits."""
        return self.cursor + self.divisor

    def share(self, rank: int) -> tuple[int, ...]:
        """The micro-batches ``rank`` computes (none for a rank that is not live)."""
        return self.shares.get(rank, ())


def plan_step(cursor: int, epoch_micro_batches: int, worker_num: int,
              active: Sequence[int], policy: BatchPolicy = BatchPolicy.CONSTANT) -> StepPlan | None:
    """The next step of an epoch from ``cursor`` on, or ``None`` when the epoch is done.
    ``epoch_micro_batches`` is a multiple of ``worker_num`` (the full job's ranks); ``active`` holds at
    least one live rank."""
    live = sorted(set(active))
    if not live:
        raise ValueError("a step needs at least one live rank")
    if live[0] < 0 or live[-1] >= worker_num:
        raise ValueError(f"live ranks {live} are not all in [0, {worker_num})")
    if not 0 <= cursor <= epoch_micro_batches:
        raise ValueError(f"cursor {cursor} is not in [0, {epoch_micro_batches}]")
    if policy is BatchPolicy.SHRINK:
        if epoch_micro_batches - cursor < len(live):
            return None
        return StepPlan(cursor, {rank: (cursor + i,) for i, rank in enumerate(live)})
    if epoch_micro_batches - cursor < worker_num:
        return None
    shares: dict[int, list[int]] = {rank: [] for rank in live}
    orphans = 0
    for offset in range(worker_num):
        if offset in shares:
            shares[offset].append(cursor + offset)
        else:  # a lost rank's micro-batch: dealt to the live ranks in turn
            shares[live[orphans % len(live)]].append(cursor + offset)
            orphans += 1
    return StepPlan(cursor, {rank: tuple(sorted(share)) for rank, share in shares.items()})


def steps_left(cursor: int, epoch_micro_batches: int, worker_num: int, live: int,
               policy: BatchPolicy = BatchPolicy.CONSTANT) -> int:
    """The steps :func:`plan_step` still plans in an epoch from ``cursor`` on while ``live`` ranks stay live."""
    per_step = live if policy is BatchPolicy.SHRINK else worker_num
    return (epoch_micro_batches - cursor) // per_step
