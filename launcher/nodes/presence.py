"""Which nodes' tftrun are alive: every node beats in node 0's cluster store, node 0 reads.

A node is alive while its tftrun beats, not its ranks, since a plain torchrun script never
talks to the scheduler. Only a count above the last one seen is life, so replayed beats keep
no dead node alive; a count starts at the wall clock in ms, so a restarted tftrun beats on above.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from launcher.nodes.link import Beat, NodeKeys, NodeLink
from recovery.control.node_range import NODE_SILENT
from recovery.control.nodes import beat_key

__all__ = ["BeatTracker", "NodePresence", "BEAT_INTERVAL"]

logger = logging.getLogger(__name__)

BEAT_INTERVAL = 0.5
"""Seconds between two beats of a node's tftrun."""


class BeatTracker:
    """Since when each node's beat count has not risen (monotonic), from what was read."""

    def __init__(self, nodes: range, started: float) -> None:
        self._latest: dict[int, Beat] = {}
        """Each node's beat of the highest count seen."""
        self._changed: dict[int, float] = dict.fromkeys(nodes, started)
        self._refused: frozenset[int] = frozenset()
        self.wanted: set[int] = set()
        """The nodes whose beats are read (only ever grows)."""

    def want(self, nodes: set[int] | range) -> None:
        """Read the beats of ``nodes`` from now on."""
        self.wanted |= set(nodes)

    def seen(self, beats: NodeKeys[Beat], now: float) -> list[tuple[int, int, int]]:
        """Take the beats read at ``now``; returns (node, count, last count) for each count
        below the last one seen: a replay."""
        replayed = []
        for node, beat in beats.found.items():
            last = self._latest.get(node)
            if last is None or beat.count > last.count:
                self._latest[node] = beat
                self._changed[node] = now
            elif beat.count < last.count:
                replayed.append((node, beat.count, last.count))
        self._refused = beats.refused
        return replayed

    def silent_since(self, node: int) -> float:
        """When ``node`` last beat (or when watching began, for a node never heard)."""
        return self._changed[node]

    def heard(self, node: int) -> bool:
        return node in self._latest

    def disputed(self) -> frozenset[int]:
        """The nodes whose beat key last held a value that is not the job's."""
        return self._refused

    def joining(self, restart_count: int, now: float) -> frozenset[int]:
        """The nodes beating (within :data:`NODE_SILENT`) whose latest beat asks to join
        group restart ``restart_count``."""
        return frozenset(node for node, beat in self._latest.items()
                         if beat.joining == restart_count
                         and now - self._changed[node] < NODE_SILENT)


class NodePresence:
    """The beating thread of one node's supervisor, through ``link`` (a link of its own to node
    0's cluster store), of ``nnodes`` nodes (``MAX`` of an elastic range); on node 0 also the
    reading one, which in an ``elastic`` job reads who joined :attr:`next_round` and then
    calls ``wake``."""

    def __init__(self, link: NodeLink, node_rank: int, nnodes: int, elastic: bool,
                 wake: Callable[[], None]) -> None:
        self._link = link
        self._node_rank = node_rank
        self._others = range(1, nnodes) if node_rank == 0 else range(0)
        self._elastic = elastic and node_rank == 0
        self._wake = wake
        self._count = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-presence", daemon=True)
        self.tracker = BeatTracker(self._others, time.monotonic())
        if self._elastic:
            self.tracker.want(self._others)
        self.next_round = 1
        """The group restart whose joins node 0 reads (set by the loop)."""
        self._joins: tuple[int, frozenset[int]] = (0, frozenset())
        """(a group restart, the nodes read as joined to it)."""
        self.joining: int | None = None
        """The group restart this node waits to join (set by launcher/nodes/rounds.py), named
        in its beats so that a hidden join key still leaves node 0 the beat."""

    @property
    def waiting(self) -> frozenset[int]:
        """Nodes that joined :attr:`next_round` (node 0 of an elastic job); empty while the
        latest read was of an earlier round."""
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
            self._closed.wait(BEAT_INTERVAL)

    def _round(self) -> None:
        self._count = max(self._count + 1, time.time_ns() // 1_000_000)
        if (joining := self.joining) is not None:  # the join key first: the beat names it
            self._link.join_round(joining, self._node_rank)
        self._link.beat(self._node_rank, Beat(self._count, joining))
        if wanted := sorted(self.tracker.wanted):
            replayed = self.tracker.seen(self._link.beats(wanted), time.monotonic())
            for node, count, last in replayed:
                self._link.alert(beat_key(node), f"a replay: count {count}, below the last "
                                                 f"seen ({last})")
        if self._elastic:
            restart = self.next_round
            joined = frozenset(self._link.joined(restart, self._others).found)
            joins = (restart, joined | self.tracker.joining(restart, time.monotonic()))
            if joins != self._joins:
                self._joins = joins
                self._wake()
