"""A distributed sampler that can start an epoch part-way through, for exact resumption: an epoch's
order depends only on ``(seed, epoch)``, and the place in it only on the step."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

from recovery.position import step_in_epoch_of

__all__ = ["ResumableDistributedSampler"]

logger = logging.getLogger(__name__)


class ResumableDistributedSampler(Sampler[int]):
    """Yields this rank's sample indices of an epoch, skipping the steps already done.

    As torch's ``DistributedSampler``: each epoch a permutation seeded with ``seed + epoch``, rank ``r``
    taking every ``num_replicas``-th index from ``r``, the remainder dropped so that all ranks run the same
    steps. Call :meth:`set_epoch` before each epoch, and :meth:`set_init_step` after a resume.

    Args:
        batch_size: samples per step on this rank.
        num_replicas: defaults to the process group's size, or 1.
        rank: defaults to the process group's rank, or 0.
        shuffle: ``False`` keeps the dataset order (then ``seed`` plays no part).
    """

    def __init__(
        self,
        dataset_size: int,
        batch_size: int,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
        if num_replicas is None:
            num_replicas = torch.distributed.get_world_size() if initialized else 1
        self.num_replicas = num_replicas
        self.rank = rank if rank is not None else (torch.distributed.get_rank() if initialized else 0)
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank {self.rank} is not in [0, {self.num_replicas})")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset_size = dataset_size
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.steps_per_epoch = dataset_size // self.num_replicas // batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"{dataset_size} samples over {self.num_replicas} ranks do not fill one batch of {batch_size}"
            )
        self.epoch = 0
        self.init_step = 0
        self._order_of: tuple[int, int, bool] | None = None
        self._order_cache = torch.empty(0, dtype=torch.int64)
        self.cursor = 0
        """Micro-batches of the current epoch that committed steps trained
        (:mod:`recovery.train.shares`): ``init_step * num_replicas`` at full membership."""
        self._cursor_step = 0  # the step in the epoch the cursor was recorded at

    @property
    def cursor_step(self) -> int:
        """The step in the epoch :attr:`cursor` was recorded at."""
        return self._cursor_step

    @property
    def epoch_micro_batches(self) -> int:
        """Micro-batches (of ``batch_size`` samples) the epoch trains."""
        return self.steps_per_epoch * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate; a different epoch than the current starts at step 0."""
        if epoch != self.epoch:
            self.init_step = self.cursor = self._cursor_step = 0
        self.epoch = epoch

    def set_init_step(self, step_in_epoch: int) -> None:
        """Skip the first ``step_in_epoch`` steps of the current epoch (they were done before a restart)."""
        if not 0 <= step_in_epoch <= self.steps_per_epoch:
            raise ValueError(f"init step {step_in_epoch} is not in [0, {self.steps_per_epoch}]")
        self.init_step = step_in_epoch
        self.cursor, self._cursor_step = step_in_epoch * self.num_replicas, step_in_epoch

    def set_cursor(self, step_in_epoch: int, cursor: int) -> None:
        """Record that after step ``step_in_epoch`` of the epoch ``cursor`` micro-batches are trained
        (under ``shrink`` a step may train fewer than ``num_replicas``)."""
        if not 0 <= cursor <= self.epoch_micro_batches:
            raise ValueError(f"cursor {cursor} is not in [0, {self.epoch_micro_batches}]")
        self.cursor, self._cursor_step = cursor, step_in_epoch

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint records of the data order, besides ``epoch`` and ``step_in_epoch``; the cursor
        differs from ``step_in_epoch * num_replicas`` only after degraded steps under ``shrink``."""
        return {"seed": self.seed, "batch_size": self.batch_size, "cursor": self.cursor,
                "cursor_step": self._cursor_step, "num_replicas": self.num_replicas}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue after step ``state_dict["step_in_epoch"]`` of epoch ``state_dict["epoch"]``; a
        recorded ``seed`` or ``batch_size`` other than this sampler's warns once: the order will not
        continue exactly."""
        seed = state_dict.get("seed", self.seed)
        batch_size = state_dict.get("batch_size", self.batch_size)
        if seed != self.seed or batch_size != self.batch_size:
            logger.warning(
                "the checkpoint was written with sampler seed %s and batch size %s, the sampler has %s and %s: "
                "the data order will not continue exactly", seed, batch_size, self.seed, self.batch_size,
            )
        self.set_epoch(state_dict["epoch"])
        # The step alone places the sampler when the cursor is missing, counts another job
        # size's micro-batches, or was recorded at another step than the checkpoint's (the
        # loop did not move it). Otherwise the cursor does: under ``shrink`` an epoch may
        # have had more steps than ``steps_per_epoch``.
        step_in_epoch = step_in_epoch_of(state_dict)
        if state_dict.get("num_replicas") == self.num_replicas \
                and state_dict.get("cursor_step") == step_in_epoch:
            self.set_cursor(step_in_epoch, state_dict["cursor"])
            self.init_step = self.cursor // self.num_replicas
        else:
            self.set_init_step(step_in_epoch)

    def epoch_indices(self) -> torch.Tensor:
        """This rank's indices of the whole current epoch, skipped steps included."""
        return self._order()[self.rank :: self.num_replicas][: self.steps_per_epoch * self.batch_size]

    def micro_batch(self, number: int) -> torch.Tensor:
        """The samples of the epoch's micro-batch ``number``: at full membership rank
        ``number % num_replicas``'s batch of step ``number // num_replicas + 1``."""
        if not 0 <= number < self.epoch_micro_batches:
            raise ValueError(f"micro-batch {number} is not in [0, {self.epoch_micro_batches})")
        return self._order()[number % self.num_replicas :: self.num_replicas][
            number // self.num_replicas * self.batch_size :][: self.batch_size]

    def _order(self) -> torch.Tensor:
        """The epoch's permutation of the data set (cached per epoch)."""
        if self._order_of != (self.seed, self.epoch, self.shuffle):
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + self.epoch)
                self._order_cache = torch.randperm(self.dataset_size, generator=generator)
            else:
                self._order_cache = torch.arange(self.dataset_size)
            self._order_of = (self.seed, self.epoch, self.shuffle)
        return self._order_cache

    def batches(self) -> Iterator[tuple[int, torch.Tensor]]:
        """``(step_in_epoch, indices)`` for each remaining step of the epoch, counted from 1: the step to
        record once it is done, and to give :meth:`set_init_step` to continue after it."""
        indices = self.epoch_indices()
        for step_in_epoch in range(self.init_step + 1, self.steps_per_epoch + 1):
            yield step_in_epoch, indices[(step_in_epoch - 1) * self.batch_size
                                         : step_in_epoch * self.batch_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_indices()[self.init_step * self.batch_size :].tolist())

    def __len__(self) -> int:
        return (self.steps_per_epoch - self.init_step) * self.batch_size
