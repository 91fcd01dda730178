"""State from a healthy replica over the live process group (ARF and in-place recovery), reading no file.
The *source* is the consistent rank at the newest step (the lowest on a tie), not a fixed rank: a
newcomer rank 0 would reset everyone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from recovery.train.collectives import Wait, all_gather_rows, blocking

__all__ = ["ReplicaReport", "gather_reports", "choose_source", "state_limit"]

STATE_SLACK = 4 << 20
"""Bytes a state may hold besides its tensors: RNG states, position, parameter groups and
``torch.save``'s framing."""


@dataclass(frozen=True)
class ReplicaReport:
    """One rank's account of its state."""

    rank: int
    consistent: bool
    global_step: int


def gather_reports(mine: ReplicaReport, wait: Wait = blocking) -> list[ReplicaReport]:
    """Every rank's report, in rank order (a collective: every rank calls it)."""
    row = (mine.rank, int(mine.consistent), mine.global_step)
    everyone = all_gather_rows([row], 3, wait, most=1)
    return [ReplicaReport(rank, bool(consistent), global_step)
            for [(rank, consistent, global_step)] in everyone]


def choose_source(reports: list[ReplicaReport], excluded: frozenset[int] = frozenset()) -> ReplicaReport | None:
    """The consistent rank with the newest state (lowest rank on a tie); ``None`` if none."""
    healthy = [r for r in reports if r.consistent and r.rank not in excluded]
    if not healthy:
        return None
    return min(healthy, key=lambda r: (-r.global_step, r.rank))


def _storage_bytes(value: Any) -> int:
    """The bytes ``torch.save`` writes for the tensors in ``value``: each storage once, whole."""
    storages: dict[int, int] = {}
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return sum(storages.values())


def state_limit(own: Mapping[str, Any]) -> int:
    """The most bytes of a replica's state this rank accepts: twice its ``own`` state, the optimizer
    counted as at least two copies of the model (Adam's moments), so that a newcomer, whose optimizer
    holds nothing yet, accepts a trained peer's."""
    model, optimizer = _storage_bytes(own.get("model")), _storage_bytes(own.get("optimizer"))
    return 2 * (_storage_bytes(own) + max(0, 2 * model - optimizer)) + STATE_SLACK
