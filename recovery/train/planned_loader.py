"""The batches of the steps ``ElasticTrainer`` plans, prefetched by the script's ``DataLoader`` workers
(``recovery.attach`` with ``num_workers > 0``); a re-form that changes the plan starts a new loader."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from recovery.train.elastic import ElasticTrainer, Step
from recovery.train.shares import plan_step

__all__ = ["PlannedLoader"]

logger = logging.getLogger(__name__)


class PlannedLoader:
    """Batches of the planned steps, from ``data``'s dataset, collate function and workers."""

    def __init__(self, data: DataLoader, trainer: ElasticTrainer) -> None:
        self._data = data
        self._trainer = trainer
        self._batches: Iterator[Any] | None = None
        self._plan: list[torch.Tensor] = []
        """The samples of each batch the current loader loads, in order."""
        self._next = 0
        """The batch of :attr:`_plan` the loader returns next."""
        logger.info("recovery.attach: batches loaded by the loader's %d worker processes",
                    data.num_workers)

    def batch(self, step: Step) -> Any:
        """``step``'s batch: the one next in line, or the first of a loader started now."""
        if self._next >= len(self._plan) or not torch.equal(self._plan[self._next], step.indices):
            self._start(step)
        assert self._batches is not None
        self._next += 1
        return next(self._batches)

    def _start(self, step: Step) -> None:
        self._batches = None  # its workers end before the next loader's start
        self._plan, self._next = list(self._planned(step)), 0
        data = self._data
        self._batches = iter(DataLoader(
            data.dataset, batch_sampler=[indices.tolist() for indices in self._plan],
            num_workers=data.num_workers, collate_fn=data.collate_fn, pin_memory=data.pin_memory,
            timeout=data.timeout, worker_init_fn=data.worker_init_fn,
            multiprocessing_context=data.multiprocessing_context, prefetch_factor=data.prefetch_factor))

    def _planned(self, step: Step) -> Iterator[torch.Tensor]:
        """``step``'s samples, then those of the epoch's steps after it, as the trainer
        will plan them if the live ranks stay the same."""
        trainer, sampler = self._trainer, self._trainer.sampler
        yield step.indices
        cursor = step.cursor
        while (plan := plan_step(cursor, sampler.epoch_micro_batches, trainer.ctx.world_size,
                                 trainer.ctx.active, trainer.batch_policy)) is not None:
            yield torch.cat([sampler.micro_batch(n) for n in plan.share(trainer.ctx.rank)])
            cursor = plan.next_cursor
