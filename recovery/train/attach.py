"""``recovery.attach``: tftrun's recovery under a DDP script's own loop (docs/quickstart-own-script.md),
over :class:`recovery.train.elastic.ElasticTrainer`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, RandomSampler

from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver
from recovery.env import WorkerEnv
from recovery.runtime import cluster
from recovery.train.elastic import ElasticTrainer, Step
from recovery.train.planned_loader import PlannedLoader
from recovery.train.sampler import ResumableDistributedSampler

__all__ = ["attach", "Job"]

CHECKPOINT_EVERY = 100
"""Global steps between two periodic checkpoints by default: the fallback for a restart of
every rank (a single death loses nothing without them)."""


def attach(model: DistributedDataParallel, optimizer: torch.optim.Optimizer, data: DataLoader, *,
           lr_scheduler: Any = None, checkpoint_every: int = CHECKPOINT_EVERY,
           log_params_hash: bool = False) -> Job:
    """Put a DDP script's model, optimizer and data under tftrun's recovery; call it after
    ``DistributedDataParallel(...)`` and before the first backward pass.

    Args:
        data: its ``DataLoader``: the dataset, ``batch_size`` (per rank and step), ``collate_fn`` and the
            sampler's ``shuffle`` and ``seed`` are taken from it.
        lr_scheduler: saved and restored with the rest.
        checkpoint_every: global steps between two periodic checkpoints of each rank.
        log_params_hash: log each committed step's parameter hash (for tests).
    """
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(f"recovery.attach wants the DistributedDataParallel model, got "
                        f"{type(model).__name__}")
    if data.batch_size is None:
        raise TypeError("recovery.attach wants a DataLoader with a batch_size")
    ctx = cluster.joined() or _context_of_group()
    sampler = ResumableDistributedSampler(
        len(data.dataset), data.batch_size, num_replicas=ctx.world_size, rank=ctx.rank,
        seed=getattr(data.sampler, "seed", 0),
        shuffle=getattr(data.sampler, "shuffle", isinstance(data.sampler, RandomSampler)))
    saver = CheckpointSaver(model.module, optimizer, lr_scheduler, sampler=sampler, prefix="attach",
                            config=CheckpointConfig(save_checkpoint_steps=checkpoint_every))
    trainer = ElasticTrainer(ctx, model, optimizer, saver=saver, sampler=sampler,
                             lr_scheduler=lr_scheduler, log_params_hash=log_params_hash)
    return Job(trainer, data)


def _context_of_group() -> cluster.ClusterContext:
    """The context of a group the script formed itself (plain torchrun): no recovery."""
    worker_env = WorkerEnv.from_env()
    if not dist.is_initialized():
        raise RuntimeError("recovery.attach needs a process group: call recovery.init() first")
    return cluster.ClusterContext(dist.get_rank(), dist.get_world_size(), 0, worker_env.node_id,
                                  worker_env.incarnation, dist.get_backend())


class Job:
    """The script's epochs and batches, as tftrun's recovery hands them out."""

    def __init__(self, trainer: ElasticTrainer, data: DataLoader) -> None:
        self.trainer = trainer
        self._data = data
        self._steps: Iterator[Step] | None = None
        self.step: Step | None = None
        """The step whose batch :meth:`batches` yielded last (its ``global_step``, ``epoch``)."""
        self._served = 0
        self._loader = PlannedLoader(data, trainer) if data.num_workers > 0 else None

    def epochs(self, stop: int) -> Iterator[int]:
        """The epochs still to train, numbered from 0 as ``range(stop)`` numbers them:
        from where the job stands (resumed, or after a rollback) up to ``stop - 1``."""
        self._steps = self.trainer.steps(epochs=stop)
        self.step = next(self._steps, None)
        while self.step is not None:
            served = self._served
            yield self.step.epoch - 1
            if self._served == served:
                raise RuntimeError("an epoch of job.epochs() ended without job.batches() "
                                   "in it: iterate job.batches() in each epoch")

    def batches(self) -> Iterator[Any]:
        """This rank's batches of the current epoch, collated by the loader's ``collate_fn``.

        In a degraded step a batch holds several ranks' worth of samples (docs/elastic.md): compute the
        loss as the mean over it, as usual."""
        if self._steps is None:
            raise RuntimeError("job.batches() runs inside a job.epochs() loop")
        epoch = self.step.epoch if self.step is not None else None
        dataset, collate = self._data.dataset, self._data.collate_fn
        while self.step is not None and self.step.epoch == epoch:
            self._served += 1
            if self._loader is not None:
                yield self._loader.batch(self.step)
            else:
                yield collate([dataset[int(index)] for index in self.step.indices])
            self.step = next(self._steps, None)
