"""Which nodes' tftrun are alive: every node beats in node 0's cluster store, node 0 reads.

A node's workers may never talk to the scheduler (a plain torchrun script), so a node is
known alive by its tftrun, not by its ranks: a thread of each node's supervisor raises
``tft/node/<K>/beat`` every :data:`BEAT_INTERVAL`; on node 0 the same thread reads the
counts of the nodes asked about (:meth:`BeatTracker.want`: those with ranks the scheduler
lacks; every node of an elastic job) and dates each change on its own monotonic clock
(the nodes' clocks are never compared). One read per node asked about and beat: a job
whose ranks register (the large ones) costs node 0 no reads. For an elastic job
(``--nnodes=MIN:MAX``) it also reads which nodes asked to join the next group restart.
The loop reads what the thread keeps; nothing here waits for the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from launcher.nodes.link import NodeLink

__all__ = ["BeatTracker", "NodePresence", "BEAT_INTERVAL"]

logger = logging.getLogger(__name__)

BEAT_INTERVAL = 0.5
"""Seconds between two beats of a node's tftrun."""


class BeatTracker:
    """Since when each node's beat count has not changed (monotonic), from what was read."""

    def __init__(self, nodes: range, started: float) -> None:
        self._counts: dict[int, int] = {}
        self._changed: dict[int, float] = dict.fromkeys(nodes, started)
        self.wanted: set[int] = set()
        """The nodes whose beats are read (added to, never taken from)."""

    def want(self, nodes: set[int] | range) -> None:
        """Read the beats of ``nodes`` from now on."""
        self.wanted |= set(nodes)

    def seen(self, counts: dict[int, int], now: float) -> None:
        for node, count in counts.items():
            if self._counts.get(node) != count:
                self._counts[node] = count
                self._changed[node] = now

    def silent_since(self, node: int) -> float:
        """When ``node`` last beat (or when watching began, for a node never heard)."""
        return self._changed[node]

    def heard(self, node: int) -> bool:
        return node in self._counts


class NodePresence:
    """The beating thread of one node's supervisor (and, on node 0, the reading one).

    Args:
        link: a link of its own to node 0's cluster store.
        node_rank: this node's rank.
        nnodes: the job's node count (``MAX`` of an elastic range): node 0 reads the beats
            of nodes ``1 … nnodes − 1``.
        elastic: node 0 also reads who joined :attr:`next_round`.
        wake: called when node 0 saw a node join the next round.
    """

    def __init__(self, link: NodeLink, node_rank: int, nnodes: int, elastic: bool,
                 wake: Callable[[], None], interval: float = BEAT_INTERVAL) -> None:
        self._link = link
        self._node_rank = node_rank
        self._others = range(1, nnodes) if node_rank == 0 else range(0)
        self._elastic = elastic and node_rank == 0
        self._wake = wake
        self._interval = interval
        self._beats = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-presence", daemon=True)
        self.tracker = BeatTracker(self._others, time.monotonic())
        if self._elastic:
            self.tracker.want(self._others)
        self.next_round = 1
        """The group restart whose joins node 0 reads (set by the loop)."""
        self._joins: tuple[int, frozenset[int]] = (0, frozenset())
        """(a group restart, the nodes read as joined to it)."""

    @property
    def waiting(self) -> frozenset[int]:
        """Nodes that joined :attr:`next_round` (node 0 of an elastic job); none while
        the latest read was of an earlier round."""
        restart, nodes = self._joins
        return nodes if restart == self.next_round else frozenset()

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._link.close()

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self._round()
            except Exception:  # noqa: BLE001 - the beats must outlive any bad answer
                logger.exception("a node beat failed; trying again")
            self._closed.wait(self._interval)

    def _round(self) -> None:
        self._beats += 1
        self._link.beat(self._node_rank, self._beats)
        if wanted := sorted(self.tracker.wanted):
            self.tracker.seen(self._link.beats(wanted), time.monotonic())
        if self._elastic:
            restart = self.next_round
            joins = (restart, self._link.joined(restart, self._others))
            if joins != self._joins:
                self._joins = joins
                self._wake()
