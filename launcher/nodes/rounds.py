"""The rounds of an elastic job (``--nnodes=MIN:MAX``) through node 0's cluster store:
every node joins the group restart it is about to start, node 0 closes it by the rules of
recovery/control/node_range.py, and each node learns the nodes it closed with. Node 0 keeps
a node joined once it read its join key or a beat naming the round, so that a stranger who
deletes the key excludes no node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from launcher.config import LaunchConfig
from launcher.nodes.link import NodeLink
from launcher.nodes.presence import NodePresence
from recovery.control.node_range import NODE_SILENT, Close, JobDone, Round, RoundWait, TooFew, close_round
from recovery.control.nodes import join_key

__all__ = ["RoundMeeting", "ROUND_POLL"]

ROUND_POLL = 0.1
"""Seconds between two looks at a forming round."""


@dataclass
class _Closing:
    """Node 0's round in the making: who joined, since when enough did."""

    restart_count: int
    previous: Round | None
    opened: float
    time_out: float
    reached: float | None = None
    joined: frozenset[int] = frozenset({0})
    disputed: frozenset[int] = field(default_factory=frozenset)


@dataclass
class _Awaiting:
    """Another node's wait for node 0 to close a round with it."""

    restart_count: int
    deadline: float
    waited: float
    wrote: int | None = None


class RoundMeeting:
    """Joins this node to each group restart of an elastic job and learns its nodes, one
    look per pass of the supervisor's loop (:meth:`begin`, then :meth:`poll`), so that the
    loop goes on handling signals, exits and the scheduler while a round forms. ``link`` is a
    link of the loop's own to node 0's store; ``presence`` this node's beats."""

    def __init__(self, config: LaunchConfig, link: NodeLink, presence: NodePresence) -> None:
        assert config.node_range is not None, "rounds are an elastic job's (--nnodes=MIN:MAX)"
        self._config = config
        self._span = span = config.node_range
        self._link = link
        self._presence = presence
        self._beats = presence.tracker
        self._nodes = range(span.high)
        self._pending: _Closing | _Awaiting | None = None

    @property
    def pending(self) -> bool:
        """A round is forming."""
        return self._pending is not None

    def begin(self, restart_count: int, previous: Round | None) -> None:
        """Join the round of group restart ``restart_count`` (another node: or a later one,
        for a node that arrives while a round runs without it)."""
        config, now = self._config, time.monotonic()
        if config.assigned_rank == 0:
            self._link.join_round(restart_count, 0)
            time_out = config.cluster_time_out if previous is None else config.node_time_out
            self._pending = _Closing(restart_count, previous, now, time_out)
        else:
            waited = max(config.cluster_time_out, config.node_time_out) + config.last_call
            self._pending = _Awaiting(max(restart_count, self._link.restarts_started() or 0),
                                      now + waited, waited)

    def poll(self) -> Round | TooFew | JobDone | None:
        """The round once it formed; TooFew: the job ends; JobDone: it ended well before
        this node joined; None: not yet."""
        pending = self._pending
        assert pending is not None, "no round is forming"
        met = self._close(pending) if isinstance(pending, _Closing) else self._await(pending)
        if met is not None:
            self.abandon()
        return met

    def abandon(self) -> None:
        """Stop forming a round (the job ends)."""
        self._pending = None
        self._presence.joining = None

    def _close(self, closing: _Closing) -> Round | TooFew | None:
        """Node 0: close the round by the rules once the nodes it waits for are there."""
        link, restart_count, now = self._link, closing.restart_count, time.monotonic()
        by_beat = self._beats.joining(restart_count, now)  # before the keys: written after
        read = link.joined(restart_count, self._nodes)
        for node in sorted(by_beat - set(read.found) - read.refused):
            link.alert(join_key(restart_count, node),
                       f"unset, while node {node}'s signed beat says it joined")
        closing.joined |= set(read.found) | by_beat
        closing.disputed |= read.refused | self._beats.disputed()
        if closing.reached is None and len(closing.joined) >= self._span.low:
            closing.reached = now
        decision = close_round(RoundWait(closing.joined,
                                         self._expected(closing.previous, closing.joined, now),
                                         closing.opened, closing.reached,
                                         closing.disputed - closing.joined),
                               self._span, now, self._config.last_call, closing.time_out)
        if isinstance(decision, Close):
            link.close_round(restart_count, decision.nodes)
            return Round(restart_count, decision.nodes)
        if isinstance(decision, TooFew):
            return TooFew(f"node 0: group restart {restart_count}: {decision.reason}")
        return None

    def _expected(self, previous: Round | None, joined: frozenset[int],
                  now: float) -> frozenset[int]:
        """Whom a round waits for: every node of the job at the start; later, the previous
        generation's nodes and those that joined, less the silent ones."""
        if previous is None:
            return frozenset(self._nodes)
        alive = {node for node in self._nodes[1:]
                 if now - self._beats.silent_since(node) < NODE_SILENT}
        return frozenset((set(previous.nodes) | joined) & (alive | {0}))

    def _await(self, waiting: _Awaiting) -> Round | TooFew | JobDone | None:
        """Another node: join, and look whether node 0 closed the round; a round closed
        without this node is followed by a join of the next one."""
        link, node = self._link, self._config.assigned_rank
        restart_count = waiting.restart_count
        if waiting.wrote == restart_count:  # this node's join key, written a poll ago, gone: a stranger hid it
            mine = link.joined(restart_count, [node])
            if not mine.found and not mine.refused and link.reachable:
                link.alert(join_key(restart_count, node), "unset since this node wrote it")
        link.join_round(restart_count, node)
        self._presence.joining = waiting.wrote = restart_count
        nodes = link.round_nodes(restart_count)
        if nodes == ():
            return JobDone(f"node {node}: the job ended before group restart "
                           f"{restart_count} took this node")
        if nodes is not None and node in nodes:
            return Round(restart_count, nodes)
        if nodes is not None:
            waiting.restart_count += 1
            return None
        if ended := link.ended():
            return TooFew(ended)
        if time.monotonic() > waiting.deadline:
            return TooFew(f"node {node}: node 0 did not start group restart "
                          f"{restart_count} with it within {waiting.waited:g}s")
        return None
