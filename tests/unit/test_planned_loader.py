"""The loader of planned batches under ``recovery.attach`` (recovery/train/planned_loader.py),
in this process (``num_workers=0``; the integration test runs it with workers): each step
gets the samples the trainer planned for it, from the batches the loader took ahead, and
a step planned otherwise (a re-form) starts the loader again from it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from recovery.train import planned_loader
from recovery.train.elastic import Step
from recovery.train.planned_loader import PlannedLoader
from recovery.train.sampler import ResumableDistributedSampler
from recovery.train.shares import BatchPolicy, plan_step

SAMPLES, BATCH, RANKS = 32, 2, 2


def _trainer(active: tuple[int, ...]) -> SimpleNamespace:
    sampler = ResumableDistributedSampler(SAMPLES, BATCH, num_replicas=RANKS, rank=0, shuffle=True)
    sampler.set_epoch(1)
    return SimpleNamespace(sampler=sampler, batch_policy=BatchPolicy.CONSTANT,
                           ctx=SimpleNamespace(world_size=RANKS, active=active, rank=0))


def _step(trainer: SimpleNamespace, cursor: int) -> Step:
    """The step the trainer plans at ``cursor`` (recovery/train/elastic.py's schedule)."""
    plan = plan_step(cursor, trainer.sampler.epoch_micro_batches, RANKS, trainer.ctx.active,
                     trainer.batch_policy)
    share = plan.share(0)
    return Step(1, 1, 1, indices=torch.cat([trainer.sampler.micro_batch(n) for n in share]),
                share=share, micro_batch_size=BATCH, divisor=plan.divisor, cursor=plan.next_cursor)


def test_each_step_gets_its_planned_samples_and_a_new_plan_restarts_the_loader(
        monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[DataLoader] = []

    class Counted(DataLoader):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(planned_loader, "DataLoader", Counted)
    dataset = torch.arange(SAMPLES) * 10
    data = DataLoader(dataset, batch_size=BATCH)
    trainer = _trainer((0, 1))
    loader = PlannedLoader(data, trainer)  # type: ignore[arg-type]
    cursor = 0
    for _ in range(3):  # whole: each step its own micro-batch
        step = _step(trainer, cursor)
        assert torch.equal(loader.batch(step), dataset[step.indices])
        cursor = step.cursor
    assert len(started) == 1  # the steps were the loader's next batches
    trainer.ctx.active = (0,)  # rank 1 lost: rank 0 computes both micro-batches now
    step = _step(trainer, cursor)
    assert len(step.indices) == 2 * BATCH
    assert torch.equal(loader.batch(step), dataset[step.indices])
    step = _step(trainer, step.cursor)
    assert torch.equal(loader.batch(step), dataset[step.indices])
    assert len(started) == 2  # one more, from the step the new membership planned
