"""The job-wide facts a node's supervisor reads in its status: what the other nodes' ranks are doing, in
counts, and which ranks are at fault, so that a node's snapshot is O(its ranks + faults), not the whole
table. The membership keeps them until a member or its state changes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["JobFacts"]


@dataclass(frozen=True)
class JobFacts:
    missing: list[int]
    """Ranks with no live process and no finished one, less the retired ones."""
    retired: list[int]
    training: frozenset[int]
    """Ranks with a live or finished process, not retired."""
    done: frozenset[int]
    """Ranks whose process finished, or retired."""
    finished_steps: tuple[tuple[int, int], ...]
    """(step, rank) of each finished process that reported a step, highest step first."""

    @classmethod
    def of(cls, worker_num: int, live: Iterable[int],
           finished: Iterable[tuple[int, int | None]], retired: set[int]) -> JobFacts:
        """The facts of a job of ``worker_num`` ranks, from the ranks of its live processes and the
        ``(rank, step)`` of its finished ones."""
        finished = list(finished)
        ended = {rank for rank, _step in finished}
        held = set(live) | ended
        missing = sorted(set(range(worker_num)).difference(held, retired))
        return cls(missing, sorted(retired), frozenset(held - retired), frozenset(ended | retired),
                   tuple(sorted(((step, rank) for rank, step in finished if step is not None),
                                reverse=True)))

    def others(self, own: range) -> dict[str, Any]:
        """The ranks outside ``own``: how many train, how many finished or were retired, and the highest
        step a finished one reported (null: none)."""
        step = next((s for s, rank in self.finished_steps if rank not in own), None)
        return {"training": len(self.training) - sum(r in self.training for r in own),
                "finished": len(self.done) - sum(r in self.done for r in own),
                "finished_step": step}
