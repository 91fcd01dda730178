"""The training position: the one value that says how far training has come. Only
:mod:`recovery.ckpt.layout` names files after it; nothing of the project is imported here."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["TrainPosition"]


@dataclass(frozen=True)
class TrainPosition:
    """Where training is: ``step_in_epoch`` steps of epoch ``epoch`` done, ``global_step`` in
    all, counted from 1 as in MindSpore's checkpoint names. It unpacks and orders as ``(epoch,
    step_in_epoch, global_step)``, so ``saver.step_end(*position)`` works; an extension unpacks
    and orders as the position it extends."""

    epoch: int = 1
    step_in_epoch: int = 0
    global_step: int = 0

    def __iter__(self) -> Iterator[int]:
        return iter((self.epoch, self.step_in_epoch, self.global_step))

    def as_dict(self) -> dict[str, int]:
        """``{"epoch", "step_in_epoch", "global_step"}``: how a checkpoint file records it."""
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                "global_step": self.global_step}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainPosition:
        """The position :meth:`as_dict` wrote (other keys are ignored)."""
        return cls(values["epoch"], step_in_epoch_of(values), values["global_step"])

    def __lt__(self, other: TrainPosition) -> bool:
        return tuple(self) < tuple(other) if isinstance(other, TrainPosition) else NotImplemented

    def __le__(self, other: TrainPosition) -> bool:
        return tuple(self) <= tuple(other) if isinstance(other, TrainPosition) else NotImplemented

    def __gt__(self, other: TrainPosition) -> bool:
        return tuple(self) > tuple(other) if isinstance(other, TrainPosition) else NotImplemented

    def __ge__(self, other: TrainPosition) -> bool:
        return tuple(self) >= tuple(other) if isinstance(other, TrainPosition) else NotImplemented


def step_in_epoch_of(values: Mapping[str, Any]) -> int:
    """The step within the epoch a file records: ``step_in_epoch``, or ``step`` in an older
    tftrun's files (CHANGELOG.md)."""
    return values["step_in_epoch"] if "step_in_epoch" in values else values["step"]
