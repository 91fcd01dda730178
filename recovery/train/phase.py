"""Where a rank is within its step: the OptTFTWrapper analogue (``recovery.wrap_optimizer``). A replica
outside ``optimizer.step()`` is *consistent*: its state is one completed step's, fit to save or copy.
The wrapper also voids a step when the trainer says so (:attr:`StepPhase.void_when`)."""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import Any

import torch

from recovery.faults import is_recoverable_device_error

__all__ = ["Phase", "COMPUTING", "UPDATING", "DONE", "StepPhase", "wrap_optimizer", "phase_of"]


class Phase(enum.StrEnum):
    """The phases of a step; the values are what the heartbeat and ``tftctl status`` show."""

    COMPUTING = "computing"
    UPDATING = "updating"
    DONE = "done"


COMPUTING, UPDATING, DONE = Phase.COMPUTING, Phase.UPDATING, Phase.DONE

_ATTRIBUTE = "_tft_phase"


class StepPhase:
    """The phase of one rank's current step, and what the trainer decided about it."""

    def __init__(self) -> None:
        self.phase = Phase.DONE
        self.global_step = 0
        """The step being run (or last run), counted over the job."""
        self.void_when: Callable[[], bool] = lambda: False
        """Asked by ``optimizer.step()``: True when the current step's update must not
        happen (its gradients are not the average). The trainer answers from its state."""
        self.device_error: BaseException | None = None
        """A recoverable device error this rank's step raised: its state is damaged."""
        self.listener: Callable[[str], None] = lambda phase: None

    @property
    def consistent(self) -> bool:
        """Not mid-update and not damaged by a device error."""
        return self.phase is not Phase.UPDATING and self.device_error is None

    def mark(self, phase: Phase) -> None:
        self.phase = phase
        self.listener(phase)

    def start_step(self, global_step: int) -> None:
        self.global_step = global_step
        self.mark(Phase.COMPUTING)


def wrap_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Make ``optimizer.step()`` report its phase; returns the same optimizer. Wrapping twice is harmless;
    :class:`~recovery.train.elastic.ElasticTrainer` wraps its optimizer itself."""
    if hasattr(optimizer, _ATTRIBUTE):
        return optimizer
    tracker = StepPhase()
    original = optimizer.step

    @functools.wraps(original)
    def step(*args: Any, **kwargs: Any) -> Any:
        if tracker.void_when():
            return None
        tracker.mark(Phase.UPDATING)
        try:
            result = original(*args, **kwargs)
        except Exception as err:
            if not is_recoverable_device_error(err):
                raise
            tracker.device_error = err  # stays UPDATING: half-updated
            return None
        tracker.mark(Phase.DONE)
        return result

    optimizer.step = step  # type: ignore[method-assign]
    setattr(optimizer, _ATTRIBUTE, tracker)
    return optimizer


def phase_of(optimizer: torch.optim.Optimizer) -> StepPhase:
    """The phase tracker of a wrapped optimizer (wrapping it first if needed)."""
    return getattr(wrap_optimizer(optimizer), _ATTRIBUTE)
