"""State from a healthy replica over the live process group (ARF and in-place recovery).

After a group forms (or while a healthy one pauses), every rank says whether its state is
that of a completed step and which; the *source* is the consistent rank at the newest step
(the lowest such rank on a tie). The source broadcasts what a checkpoint would hold
(model, optimizer, LR scheduler, RNG states, position), and every rank that is behind or
damaged loads it: no file is read. The others take part in the broadcast and keep their
own state. Broadcasting from a fixed rank would be wrong: when rank 0 is the newcomer it
would reset everyone (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recovery.train.collectives import Wait, all_gather_rows, blocking, broadcast_plain

__all__ = ["ReplicaReport", "gather_reports", "choose_source", "broadcast_state"]


@dataclass(frozen=True)
class ReplicaReport:
    """One rank's account of its state."""

    rank: int
    consistent: bool
    global_step: int


def gather_reports(mine: ReplicaReport, wait: Wait = blocking) -> list[ReplicaReport]:
    """Every rank's report, in rank order (a collective: every rank calls it)."""
    row = (mine.rank, int(mine.consistent), mine.global_step)
    everyone = all_gather_rows([row], 3, wait)
    return [ReplicaReport(rank, bool(consistent), global_step)
            for [(rank, consistent, global_step)] in everyone]


def choose_source(reports: list[ReplicaReport], excluded: frozenset[int] = frozenset()) -> ReplicaReport | None:
    """The consistent rank with the newest state (lowest rank on a tie); ``None`` if none."""
    healthy = [r for r in reports if r.consistent and r.rank not in excluded]
    if not healthy:
        return None
    return min(healthy, key=lambda r: (-r.global_step, r.rank))


def broadcast_state(state: dict[str, Any] | None, source: int,
                    wait: Wait = blocking) -> dict[str, Any]:
    """Send ``state`` from ``source`` to every rank; returns it on every rank.

    ``state`` is only read on the source (pass ``None`` elsewhere). It travels as
    ``torch.save`` bytes and is loaded with ``weights_only=True``: a peer's payload that
    would need arbitrary unpickling raises
    :class:`~recovery.train.collectives.RefusedPayload` instead of running.
    """
    return broadcast_plain(state, source, wait)
