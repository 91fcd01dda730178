"""The rounds of an elastic job (``--nnodes=MIN:MAX``) through node 0's cluster store:
every node joins the group restart it is about to start, node 0 closes it by the rules of
recovery/control/node_range.py, and each node learns the nodes it closed with.

Node 0 keeps a node joined once it read its join key or a beat naming the round, so a
stranger who deletes the key excludes no node.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from launcher.config import LaunchConfig
from launcher.nodes.link import NodeLink
from launcher.nodes.presence import NodePresence
from recovery.control.node_range import NODE_SILENT, Close, JobDone, Round, RoundWait, TooFew, close_round
from recovery.control.nodes import join_key

__all__ = ["RoundMeeting"]

_POLL = 0.1


class RoundMeeting:
    """Joins this node to each group restart of an elastic job and returns its nodes.

    Args:
        link: node 0's cluster store (a link of the loop's own).
        presence: this node's beats (node 0: when each other node last beat).
        interrupted: whether a signal to tftrun came in (the wait gives up at once).
    """

    def __init__(self, config: LaunchConfig, link: NodeLink, presence: NodePresence,
                 interrupted: Callable[[], bool]) -> None:
        assert config.node_range is not None, "rounds are an elastic job's (--nnodes=MIN:MAX)"
        self._config = config
        self._span = span = config.node_range
        self._link = link
        self._presence = presence
        self._beats = presence.tracker
        self._interrupted = interrupted
        self._nodes = range(span.high)

    def meet(self, restart_count: int,
             previous: Round | None) -> Round | TooFew | JobDone | None:
        """The round of group restart ``restart_count`` (or a later one, for a node that
        arrives while a round runs without it); TooFew: the job ends; JobDone: it ended well
        before this node joined; None: a signal came in."""
        if self._config.assigned_rank == 0:
            return self._close(restart_count, previous)
        try:
            return self._await(max(restart_count, self._link.restarts_started() or 0))
        finally:
            self._presence.joining = None

    def _close(self, restart_count: int, previous: Round | None) -> Round | TooFew | None:
        """Node 0: wait for the nodes by the rules, then say which the round runs on."""
        config, link = self._config, self._link
        link.join_round(restart_count, 0)
        opened = time.monotonic()
        reached: float | None = None
        time_out = config.cluster_time_out if previous is None else config.node_time_out
        joined, disputed = frozenset({0}), frozenset[int]()
        while True:
            now = time.monotonic()
            by_beat = self._beats.joining(restart_count, now)  # before the keys: written after
            read = link.joined(restart_count, self._nodes)
            for node in sorted(by_beat - set(read.found) - read.refused):
                link.alert(join_key(restart_count, node),
                           f"unset, while node {node}'s signed beat says it joined")
            joined |= set(read.found) | by_beat
            disputed |= read.refused | self._beats.disputed()
            if reached is None and len(joined) >= self._span.low:
                reached = now
            decision = close_round(RoundWait(joined, self._expected(previous, joined, now),
                                             opened, reached, disputed - joined),
                                   self._span, now, config.last_call, time_out)
            if isinstance(decision, Close):
                link.close_round(restart_count, decision.nodes)
                return Round(restart_count, decision.nodes)
            if isinstance(decision, TooFew):
                return TooFew(f"node 0: group restart {restart_count}: {decision.reason}")
            if self._interrupted():
                return None
            time.sleep(min(_POLL, max(0.0, decision.until - now)))

    def _expected(self, previous: Round | None, joined: frozenset[int],
                  now: float) -> frozenset[int]:
        """Whom a round waits for: every node of the job at the start; later, the previous
        generation's nodes and those that joined, less the silent ones."""
        if previous is None:
            return frozenset(self._nodes)
        alive = {node for node in self._nodes[1:]
                 if now - self._beats.silent_since(node) < NODE_SILENT}
        return frozenset((set(previous.nodes) | joined) & (alive | {0}))

    def _await(self, restart_count: int) -> Round | TooFew | JobDone | None:
        """Another node: join, and wait for node 0 to close the round; a round closed
        without this node is followed by a join of the next one."""
        config, link = self._config, self._link
        node = config.assigned_rank
        waited = max(config.cluster_time_out, config.node_time_out) + config.last_call
        deadline = time.monotonic() + waited
        wrote: int | None = None
        while True:
            if wrote == restart_count:
                self._check_own_join(restart_count)
            link.join_round(restart_count, node)
            self._presence.joining = wrote = restart_count
            nodes = link.round_nodes(restart_count)
            if nodes == ():
                return JobDone(f"node {node}: the job ended before group restart "
                               f"{restart_count} took this node")
            if nodes is not None and node in nodes:
                return Round(restart_count, nodes)
            if nodes is not None:
                restart_count += 1
                continue
            if ended := link.ended():
                return TooFew(ended)
            if time.monotonic() > deadline:
                return TooFew(f"node {node}: node 0 did not start group restart "
                              f"{restart_count} with it within {waited:g}s")
            if self._interrupted():
                return None
            time.sleep(_POLL)

    def _check_own_join(self, restart_count: int) -> None:
        """Alert when this node's join key, written a poll ago, is gone (a stranger hid it)."""
        node = self._config.assigned_rank
        mine = self._link.joined(restart_count, [node])
        if not mine.found and not mine.refused and self._link.reachable:
            self._link.alert(join_key(restart_count, node), "unset since this node wrote it")
