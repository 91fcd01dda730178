"""The fast verdict on a lost node, free of I/O (docs/scheduler.md, *A peer's failure reported*).

A survivor's report that a collective failed on a peer proves nothing alone (a faulty survivor must not
evict its peers), so a reported node is judged at once only when the beat its tftrun raises in the
store has not moved for :data:`QUIET`; a rank that merely hangs is left to the timeouts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["PeerReport", "PeerReports", "BeatClock", "peer_host", "node_host", "node_index",
           "NODE_BEAT_EVERY", "QUIET", "WATCH_FOR", "POLL"]

NODE_BEAT_EVERY = 0.5
"""Seconds between two beats of a node's tftrun (launcher/nodes/presence.py)."""
QUIET = 2 * NODE_BEAT_EVERY
"""A node whose beat has not moved for longer, once a peer failure points at it, is gone."""
WATCH_FOR = 10.0
"""Seconds a report keeps the scheduler reading the beats of the nodes it points at."""
POLL = 0.2
"""Seconds between two reads of those beats while a report is open."""
_ADDRESS = re.compile(r"\[([0-9A-Fa-f.:]+)\]:\d+")
"""gloo names the peer of a broken pair as ``[ADDRESS]:PORT``."""


def peer_host(cause: str) -> str | None:
    """The peer's address in a collective's error, if it names one."""
    found = _ADDRESS.search(cause)
    return found.group(1) if found else None


def node_host(node: str) -> str:
    """The address in a node's name in its beats (``host/rank``, launcher/supervisor/beats.py)."""
    return node.rpartition("/")[0]


def node_index(node: str) -> int | None:
    """The node rank in a node's name; ``None`` while it has none."""
    index = node.rpartition("/")[2]
    return int(index) if index.isdigit() else None


@dataclass(frozen=True)
class PeerReport:
    """Rank ``reporter`` (beaten for by node ``node``, if any) saw a collective fail on a
    peer at ``peer`` (an address; ``None``: not named), at ``at`` (monotonic)."""

    reporter: int
    node: str | None
    peer: str | None
    at: float


class BeatClock:
    """Since when (monotonic) each node's beat count has stood still, from what was read
    at each poll: a node first read, or read again after a poll that left it out, is
    taken to have beaten then (what it did between two reads is not known)."""

    def __init__(self) -> None:
        self._counts: dict[str, int | None] = {}
        self._since: dict[str, float] = {}

    def read(self, counts: Mapping[str, int | None], now: float) -> None:
        """This poll's counts: a node left out is forgotten."""
        for node in set(self._counts) - set(counts):
            del self._counts[node], self._since[node]
        for node, count in counts.items():
            if node not in self._counts or self._counts[node] != count:
                self._counts[node], self._since[node] = count, now

    def still_since(self, node: str) -> float | None:
        return self._since.get(node)

    def forget(self) -> None:
        self._counts.clear()
        self._since.clear()


class PeerReports:
    """The open reports, and the nodes they condemn."""

    def __init__(self) -> None:
        self._reports: list[PeerReport] = []

    def add(self, report: PeerReport) -> None:
        self._reports.append(report)

    @property
    def reporter(self) -> int | None:
        """The lowest rank among the open reports' (named in the verdict's event)."""
        return min((r.reporter for r in self._reports), default=None)

    def open(self, now: float) -> bool:
        """Whether a report is still watched for (older ones are dropped)."""
        self._reports = [r for r in self._reports if now - r.at <= WATCH_FOR]
        return bool(self._reports)

    def suspects(self, nodes: Iterable[str], now: float) -> set[str]:
        """The nodes of ``nodes`` an open report points at: its peer's node, or every node
        but the reporter's when the peer is not named (or on no node known)."""
        nodes = set(nodes)
        found: set[str] = set()
        for report in self._reports:
            if now - report.at > WATCH_FOR:
                continue
            others = nodes - {report.node}
            named = {node for node in others if node_host(node) == report.peer}
            found |= named or others
        return found

    def confirmed(self, nodes: Iterable[str], still_since: Mapping[str, float], now: float
                  ) -> dict[str, float]:
        """The suspects whose beat has stood still for more than :data:`QUIET`, with how
        long: the nodes to judge now. A node with no beat read is never one."""
        return {node: now - since for node in self.suspects(nodes, now)
                if (since := still_since.get(node)) is not None and now - since > QUIET}
