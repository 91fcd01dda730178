"""A distributed sampler that can start an epoch part-way through, for exact resumption.

The order of an epoch is a pure function of ``(seed, epoch)``, and the place in it a
function of the step, so a job that restarts at ``(epoch, step)`` sees exactly the
samples the uninterrupted job would have seen, on every rank.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

__all__ = ["ResumableDistributedSampler"]

logger = logging.getLogger(__name__)


class ResumableDistributedSampler(Sampler[int]):
    """Yields this rank's sample indices of an epoch, skipping the steps already done.

    Each epoch is a permutation of ``range(dataset_size)`` drawn from a generator seeded
    with ``seed + epoch`` (as torch's ``DistributedSampler``); rank ``r`` takes every
    ``num_replicas``-th index from ``r``. Every rank gets the same number of whole batches
    (the remainder is dropped), so all ranks run the same number of steps per epoch.

    Use it like ``DistributedSampler``: call :meth:`set_epoch` before each epoch. After a
    resume, :meth:`set_init_step` makes the current epoch start after the steps already
    done; moving to another epoch starts that one from its first step.

    Args:
        dataset_size: number of samples in the dataset.
        batch_size: samples per step on this rank (a step skips this many indices).
        num_replicas: number of ranks; defaults to the process group's size, or 1.
        rank: this rank; defaults to the process group's rank, or 0.
        seed: the seed of every epoch's permutation.
        shuffle: ``False`` keeps the dataset order (then ``seed`` plays no part).

    Raises:
        ValueError: a rank outside ``[0, num_replicas)``, or too few samples for one step.
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

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate; a different epoch than the current starts at step 0."""
        if epoch != self.epoch:
            self.init_step = 0
        self.epoch = epoch

    def set_init_step(self, step_in_epoch: int) -> None:
        """Skip the first ``step_in_epoch`` steps of the current epoch (they were done before
        a restart).

        Raises:
            ValueError: ``step_in_epoch`` is negative or beyond the epoch's end.
        """
        if not 0 <= step_in_epoch <= self.steps_per_epoch:
            raise ValueError(f"init step {step_in_epoch} is not in [0, {self.steps_per_epoch}]")
        self.init_step = step_in_epoch

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint records of the data order: ``seed`` and ``batch_size``.

        The data position is the checkpoint's own (its epoch and step in the epoch): a
        checkpoint adds it as ``epoch`` and ``step``, the keys its files have always had
        (:class:`recovery.ckpt.checkpoint.CheckpointSaver`).
        """
        return {"seed": self.seed, "batch_size": self.batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue after step ``state_dict["step"]`` of epoch ``state_dict["epoch"]``.

        A ``seed`` or ``batch_size`` other than this sampler's (when recorded) is allowed,
        with one warning: the data order will not continue exactly.
        """
        seed = state_dict.get("seed", self.seed)
        batch_size = state_dict.get("batch_size", self.batch_size)
        if seed != self.seed or batch_size != self.batch_size:
            logger.warning(
                "the checkpoint was written with sampler seed %s and batch size %s, the sampler has %s and %s: "
                "the data order will not continue exactly", seed, batch_size, self.seed, self.batch_size,
            )
        self.set_epoch(state_dict["epoch"])
        self.set_init_step(state_dict["step"])

    def epoch_indices(self) -> torch.Tensor:
        """This rank's indices of the whole current epoch, skipped steps included."""
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.dataset_size, generator=generator)
        else:
            order = torch.arange(self.dataset_size)
        return order[self.rank :: self.num_replicas][: self.steps_per_epoch * self.batch_size]

    def batches(self) -> Iterator[tuple[int, torch.Tensor]]:
        """``(step_in_epoch, indices)`` for each remaining step of the epoch, counted from 1.

        The step is the one to record in a checkpoint once it is done, and the value to
        give :meth:`set_init_step` to continue after it.
        """
        indices = self.epoch_indices()
        for step_in_epoch in range(self.init_step + 1, self.steps_per_epoch + 1):
            yield step_in_epoch, indices[(step_in_epoch - 1) * self.batch_size
                                         : step_in_epoch * self.batch_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_indices()[self.init_step * self.batch_size :].tolist())

    def __len__(self) -> int:
        return (self.steps_per_epoch - self.init_step) * self.batch_size
