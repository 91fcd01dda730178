"""Who computes which samples of a step, for any set of live ranks: the pure core of
degraded training (docs/elastic.md).

An epoch's trained samples are cut into *micro-batches* of ``batch_size`` samples,
numbered from 0 in the order the epoch trains them (the sampler says which samples each
holds: :meth:`recovery.train.sampler.ResumableDistributedSampler.micro_batch`). The
*cursor* counts the micro-batches of the epoch that committed steps have trained; it
advances only when a step commits, so a step that a death voided is planned again, at
the new membership, from the same cursor.

A step at full membership trains ``worker_num`` micro-batches, rank ``r`` the ``r``-th of
them. With only some ranks live, :class:`BatchPolicy` decides:

* ``constant`` (the default): the step still trains the same ``worker_num`` micro-batches;
  each live rank keeps its own and the lost ranks' ones are dealt to the live ranks in
  turn. A rank's gradient is the mean over its samples; weighted by its micro-batch count
  and summed, divided by ``worker_num`` it is the summed per-sample gradient over the
  global sample count: the update of the full job, only summed in another order.
* ``shrink``: the step trains one micro-batch per live rank (torchft's behaviour): fewer
  samples a step, more steps an epoch. At an epoch's end fewer micro-batches than live
  ranks are left untrained (as a drop-last sampler leaves them).

Nothing here does I/O or imports torch (tests/unit/test_shares.py draws kill schedules
with Hypothesis).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BatchPolicy", "StepPlan", "plan_step", "steps_left"]


class BatchPolicy(enum.StrEnum):
    """How many samples a step trains when ranks are missing."""

    CONSTANT = "constant"
    """Always ``worker_num`` micro-batches: the live ranks compute the lost ones too."""
    SHRINK = "shrink"
    """One micro-batch per live rank: the global batch shrinks with the membership."""


@dataclass(frozen=True)
class StepPlan:
    """One step's work: which micro-batches each live rank computes.

    Attributes:
        cursor: the epoch's cursor before the step (micro-batches already trained).
        shares: live rank -> the micro-batches it computes, in ascending order.
        divisor: what the summed, share-weighted gradient is divided by: the micro-batches
            the step trains (never the number of live ranks).
    """

    cursor: int
    shares: dict[int, tuple[int, ...]]

    @property
    def size(self) -> int:
        """Micro-batches this step trains: how far the cursor moves when it commits."""
        return sum(len(share) for share in self.shares.values())

    @property
    def divisor(self) -> int:
        return self.size

    @property
    def next_cursor(self) -> int:
        """The cursor once this step commits."""
        return self.cursor + self.size

    def share(self, rank: int) -> tuple[int, ...]:
        """The micro-batches ``rank`` computes (none for a rank that is not live)."""
        return self.shares.get(rank, ())


def plan_step(cursor: int, epoch_micro_batches: int, worker_num: int,
              active: Sequence[int], policy: BatchPolicy = BatchPolicy.CONSTANT) -> StepPlan | None:
    """The next step of an epoch from ``cursor`` on, or ``None`` when the epoch is done.

    Args:
        cursor: micro-batches of the epoch committed steps have trained.
        epoch_micro_batches: micro-batches in the epoch (a multiple of ``worker_num``).
        worker_num: the ranks of the full job.
        active: the live ranks (each in ``[0, worker_num)``), at least one.
        policy: what a step trains with ranks missing.

    Raises:
        ValueError: no live rank, a rank outside the job, or a cursor past the epoch.
    """
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
    """The steps :func:`plan_step` still plans in an epoch from ``cursor`` on while
    ``live`` ranks stay live: ``worker_num`` micro-batches a step under ``constant``,
    ``live`` under ``shrink`` (so more steps while ranks are missing)."""
    per_step = live if policy is BatchPolicy.SHRINK else worker_num
    return (epoch_micro_batches - cursor) // per_step
