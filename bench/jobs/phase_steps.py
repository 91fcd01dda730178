"""The timed training steps of bench/phase_overhead.py, shared with its tftrun job (phase_loop.py).

Three variants of the main job's step train one model, interleaved round after round:

* ``plain``: the bare ``torch.optim.SGD`` (lr 1e-2, no momentum: the template's);
* ``wrapped``: an SGD through ``recovery.wrap_optimizer``, its phase tracker marking
  every step as ``ElasticTrainer`` does (``start_step``: computing; then updating and done
  inside ``optimizer.step()``), each mark calling the listener it is given;
* ``plain again``: a second bare SGD, so that the spread between two identical variants
  shows how much of a difference is noise.

The batch (32 samples of the template's MLP, 784-512-512-10) is drawn once: loading
data each step would only dilute the wrapper's share.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "templates" / "mnist"))
from train import build_model  # noqa: E402 - the template's model, found through its folder

from recovery.train.phase import phase_of  # noqa: E402

VARIANTS = ("plain", "wrapped", "plain again")
BATCH = 32
WARMUP_STEPS = 10


@dataclass(frozen=True)
class Variant:
    name: str
    optimizer: torch.optim.Optimizer
    start_step: Callable[[int], None] | None
    """What the trainer calls when a step starts (the wrapped variant's ``computing``)."""


class PhaseBench:
    """One model, its batch and the three variants' optimizers over its parameters.

    Args:
        listener: told each phase of the wrapped variant (``ClusterContext.report_phase``).
        exchange: called between ``backward()`` and ``optimizer.step()`` (the gradient
            all-reduce of a multi-process job; nothing in one process).
    """

    def __init__(self, listener: Callable[[str], None], exchange: Callable[[torch.nn.Module], None]) -> None:
        torch.manual_seed(0)
        self.model = build_model()
        self.inputs, self.labels = torch.randn(BATCH, 28 * 28), torch.randint(0, 10, (BATCH,))
        self.exchange = exchange
        self.variants = []
        for name in VARIANTS:
            optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-2)
            start_step = None
            if name == "wrapped":
                tracker = phase_of(optimizer)
                tracker.listener = listener
                start_step = tracker.start_step
            self.variants.append(Variant(name, optimizer, start_step))

    def seconds_per_step(self, variant: Variant, steps: int) -> float:
        """Mean wall time of ``steps`` steps of ``variant``, after a short warm-up."""
        for step in range(1, WARMUP_STEPS + steps + 1):
            if step == WARMUP_STEPS + 1:
                started = time.perf_counter()
            if variant.start_step is not None:
                variant.start_step(step)
            variant.optimizer.zero_grad()
            F.cross_entropy(self.model(self.inputs), self.labels).backward()
            self.exchange(self.model)
            variant.optimizer.step()
        return (time.perf_counter() - started) / steps

    def rounds(self, rounds: int, steps: int) -> dict[str, list[float]]:
        """Seconds per step of every variant in each round; the order rotates every round,
        so that no variant always runs right after another (or first, on a cold cache)."""
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for round_ in range(rounds):
            shift = round_ % len(self.variants)
            for variant in self.variants[shift:] + self.variants[:shift]:
                times[variant.name].append(self.seconds_per_step(variant, steps))
        return times
