"""A small training job whose checkpoints the checkpoint tests save and compare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver
from recovery.train.sampler import ResumableDistributedSampler


class TinyJob:
    """A tiny model with a momentum optimizer, an LR scheduler and a sampler."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.5)
        self.sampler = ResumableDistributedSampler(40, 4, seed=7)

    def step(self) -> None:
        self.optimizer.zero_grad()
        self.model(torch.randn(4, 6)).pow(2).sum().backward()
        self.optimizer.step()
        self.scheduler.step()

    def saver(self, directory: Path, **config: Any) -> CheckpointSaver:
        saver = CheckpointSaver(
            self.model, self.optimizer, self.scheduler, config=CheckpointConfig(**config),
            prefix="net", directory=directory, sampler=self.sampler,
        )
        return saver


def ckpt_names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.ckpt"))


def assert_same_state(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_state(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_state(x, y)
    else:
        assert a == b
