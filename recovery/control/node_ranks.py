"""Node ranks handed out by node 0's scheduler in order of arrival, free of I/O.

A node started without ``--node_rank`` asks with its node id, a name that survives a restart of its
tftrun (docs/multi-node.md#automatic-node-ranks). Ranks are never taken back, so a node that is gone
keeps its place, and are persisted before the answer, so a relaunched scheduler hands out the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["NodeRanks", "Given", "Refused"]


@dataclass(frozen=True)
class Given:
    """The node's rank; ``returning``: the node id had it already."""

    rank: int
    returning: bool


@dataclass(frozen=True)
class Refused:
    """No rank for the node: ``reason`` (a word) and ``message`` (one line, for a person)."""

    reason: str
    message: str


class NodeRanks:
    """The ranks handed out so far, by node id (node 0 is never in it)."""

    def __init__(self, ranks: dict[str, int] | None = None) -> None:
        self.ranks: dict[str, int] = dict(ranks or {})

    def assign(self, node_id: str, nproc: int, worker_num: int) -> Given | Refused:
        """The rank of the node ``node_id``, which runs ``nproc`` of the ``worker_num``
        workers of the job."""
        known = self.ranks.get(node_id)
        if known is not None:
            return Given(known, returning=True)
        if nproc < 1 or worker_num % nproc:
            return Refused("nproc", f"this node's {nproc} workers do not divide the job's "
                                    f"{worker_num}: give every node the same --nproc_per_node")
        nnodes = worker_num // nproc
        rank = len(self.ranks) + 1
        if rank >= nnodes:
            holders = ", ".join(f"{r}: {n}" for n, r in sorted(self.ranks.items(),
                                                              key=lambda item: item[1]))
            return Refused("full", f"the job's {nnodes} nodes all have their ranks (0: node 0"
                                   f"{', ' if holders else ''}{holders}); node {node_id!r} is "
                                   f"not one of them (a node that comes back needs the node "
                                   f"id it had: --node_id)")
        self.ranks[node_id] = rank
        return Given(rank, returning=False)

    def to_json(self) -> dict[str, int]:
        return dict(self.ranks)

    @staticmethod
    def parse(data: dict[str, Any]) -> NodeRanks:
        """:meth:`to_json`'s output taken back; raises ValueError on a malformed table."""
        ranks = {str(node_id): int(rank) for node_id, rank in data.items()}
        if sorted(ranks.values()) != list(range(1, len(ranks) + 1)):
            raise ValueError(f"node ranks {sorted(ranks.values())} are not 1..{len(ranks)}")
        return NodeRanks(ranks)
