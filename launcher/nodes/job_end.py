"""The job's end reaches every node (docs/multi-node.md, *The job's end*): after writing
``tft/over``, node 0 keeps its store up until every other beating node has left or
:data:`END_WAIT` passed, since the store dies with its scheduler and the others must read it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.nodes.link import NodeLink
from launcher.nodes.presence import BeatTracker

__all__ = ["JobEnd", "Over", "parse_over", "done_line", "heard", "waiting_for", "END_WAIT", "STILL", "DONE_GRACE",
           "ENDED_ON_NODE_0"]

END_WAIT = 10.0
"""The most seconds node 0 keeps its store up for the other nodes once its job ended."""
DONE_GRACE = 5.0
"""Seconds another node's workers get to end by themselves after node 0's job ended well
(they may be finishing the same job) before they are stopped."""
STILL = 2.0
"""A node whose beat has not moved for this long is gone: node 0 does not wait for it."""
ENDED_ON_NODE_0 = "the job ended on node 0"


@dataclass(frozen=True)
class Over:
    """What node 0 said of the job's end."""

    status: int
    reason: str

    def value(self) -> str:
        return json.dumps({"status": self.status, "reason": self.reason})


def parse_over(text: str | None) -> Over | None:
    """``tft/over``'s value; ``None`` when unset or not one."""
    try:
        found = json.loads(text) if text is not None else None
        return Over(int(found["status"]), str(found["reason"]))
    except (ValueError, TypeError, KeyError):
        return None


def done_line(node_rank: int | None, over: Over) -> str:
    """What a node other than node 0 says when it ends because node 0's job ended."""
    return (f"{ENDED_ON_NODE_0} (exit {over.status}: {over.reason}): "
            f"node {node_rank} has nothing left to run")


def heard(over: Over | None, node_rank: int | None) -> tuple[str, str]:
    """(line when the job ended well, why this node ends otherwise); both empty while node 0
    said nothing."""
    if over is None:
        return "", ""
    if over.status == 0:
        return done_line(node_rank, over), ""
    return "", f"node 0: {over.reason}"


def waiting_for(nodes: range, left: frozenset[int], still_since: Mapping[int, float],
                now: float) -> set[int]:
    """The nodes node 0 still waits for: not left, and beating within :data:`STILL`."""
    return {node for node in nodes if node not in left and now - still_since[node] < STILL}


class JobEnd:
    """One node's part in the job's end, through ``link`` (a link of the loop's own to node 0's
    store), of ``nnodes`` nodes (``MAX`` of an elastic range)."""

    def __init__(self, link: NodeLink, node_rank: int, nnodes: int) -> None:
        self._link = link
        self._node_rank = node_rank
        self._others = range(1, nnodes) if node_rank == 0 else range(0)
        self._since: float | None = None
        self._beats: BeatTracker | None = None
        self._left: frozenset[int] = frozenset()

    def ending(self, status: int, reason: str) -> None:
        """This node's job ends: node 0 tells the others; another node says why on stderr."""
        if self._node_rank == 0:
            self._link.over(Over(status, reason).value())
            self._since = time.monotonic()
            self._beats = BeatTracker(self._others, self._since)
        elif reason.startswith(ENDED_ON_NODE_0):
            print(f"tftrun: {reason}", file=sys.stderr, flush=True)

    def leave(self) -> None:
        """Another node is done with node 0's scheduler: node 0 waits for it no more."""
        if self._node_rank != 0:
            self._link.leave(self._node_rank)

    def may_close(self) -> bool:
        """Whether node 0 may stop its store: every other node left or is gone, or
        :data:`END_WAIT` passed. Always True on another node."""
        if self._since is None or self._beats is None:
            return True
        now = time.monotonic()
        if now - self._since >= END_WAIT:
            return True
        self._left |= self._link.left([node for node in self._others if node not in self._left])
        self._beats.seen(self._link.beats([n for n in self._others if n not in self._left]), now)
        still = {node: self._beats.silent_since(node) for node in self._others}
        return not waiting_for(self._others, self._left, still, now)
