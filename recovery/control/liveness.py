"""The heartbeat and progress rules of the scheduler's membership (docs/scheduler.md): who
is declared lost or hung, and when the rules are next due. A mixin of
:class:`~recovery.control.membership.Membership`, whose tables it reads."""

from __future__ import annotations

import heapq
from typing import Any

from recovery.control.members import ALIVE, FINISHED, IN_GENERATION, Member, MemberState, NodeSeen, Verdict
from recovery.timeouts import Timeouts

__all__ = ["LivenessRules"]

_QUIET_BEATS = 2
"""Heartbeat intervals of silence after which a member may have stopped: no progress
verdict is passed until the heartbeat rule has judged it or it is heard again."""


class LivenessRules:
    """Judges silence and progress; the membership's state is the host class's."""

    members: dict[str, Member]
    nodes: dict[str, NodeSeen]
    timeouts: Timeouts
    facts_version: int
    _formed: frozenset[tuple[str, int]]
    _completeness_at: int | None
    _incomplete_since: float | None

    def check(self) -> None:
        """Apply the heartbeat and progress rules; called periodically."""
        now = self.clock.monotonic()
        self._judge_nodes({node: now - seen.heard_at for node, seen in self.nodes.items()
                           if not seen.judged
                           and now - seen.heard_at > self.timeouts.heartbeat_timeout})
        for member in self._live():
            silent = now - member.heartbeat_at
            if silent > self.timeouts.heartbeat_timeout and not self._quiet_node(member.via, now):
                self._declare_lost(member, silent)
        if self._completeness_at != self.facts_version:
            self._update_completeness()
        self._check_progress(now)

    def _quiet_node(self, node: str | None, now: float) -> bool:
        """Whether ``node``'s supervisor has not beaten for :data:`_QUIET_BEATS` intervals either. Then
        its ranks are left to the node's own verdict, due within about a beat, so a lost node's ranks
        are judged at once: one degraded generation, not one per rank."""
        seen = None if node is None else self.nodes.get(node)
        return (seen is not None and not seen.judged
                and now - seen.heard_at > _QUIET_BEATS * self.timeouts.beat_interval)

    def judge_reported_nodes(self, silent_nodes: dict[str, float], reported_by: int) -> None:
        """Nodes a survivor's peer failure points at, whose tftrun stopped beating
        (recovery/control/peer_reports.py): judged now, as a silent node is."""
        self._judge_nodes({node: silent for node, silent in silent_nodes.items()
                           if node in self.nodes and not self.nodes[node].judged}, reported_by)

    def _judge_nodes(self, silent_nodes: dict[str, float], reported_by: int | None = None) -> None:
        """A node whose supervisor has not beaten for the heartbeat timeout is ``node_silent``, and each
        of its live ranks is lost: nobody vouches for them."""
        if not silent_nodes:
            return
        ranks: dict[str, list[Member]] = {node: [] for node in silent_nodes}
        for member in self._live():
            if member.via in ranks:
                ranks[member.via].append(member)
        for node, silent in silent_nodes.items():
            self.nodes[node].judged = True
            self._emit("node_silent", node=node, silent_s=round(silent, 3),
                       ranks=sorted(m.rank for m in ranks[node]),
                       **({} if reported_by is None else {"reported_by": reported_by}))
            for member in ranks[node]:
                self._declare_lost(member, silent)

    def _declare_lost(self, member: Member, silent: float) -> None:
        """The heartbeat rule's verdict on ``member``, silent for ``silent`` seconds."""
        self._move(member, MemberState.LOST)
        self._emit("verdict", **member.fields(), verdict=Verdict.HEARTBEAT.value,
                   silent_s=round(silent, 3), **({} if member.via is None else {"node": member.via}))
        self._start_cooldown(member.node_id, member.rank, f"no heartbeat for {silent:.1f}s")

    def _check_progress(self, now: float) -> None:
        """The progress rule: a member is hung once another of its generation has been ahead of it for
        ``progress_timeout`` (what counts as ahead, and when the clock starts: docs/scheduler.md)."""
        if not self._generation_whole_and_heard(now):
            return
        members = [m for m in self._live() if (m.node_id, m.incarnation) in self._formed]
        highest = _two_highest(m.generation_step for m in members)
        for member in members:
            if member.state is not ALIVE:
                continue
            ahead = _highest_of_others(highest, member.generation_step)
            if ahead is None or (member.generation_step is not None
                                 and ahead <= member.generation_step):
                member.behind_since = None
                continue
            if member.behind_since is None:
                member.behind_since = now
            behind = now - member.behind_since
            if behind > self.timeouts.progress_timeout:
                self._move(member, MemberState.HUNG)
                self._emit("verdict", **member.fields(), verdict=Verdict.PROGRESS.value,
                           step=member.generation_step, others_step=ahead,
                           stalled_s=round(now - member.progress_at, 3),
                           behind_s=round(behind, 3))

    def _generation_whole_and_heard(self, now: float) -> bool:
        """Whether progress may be judged: every process of the formed generation is still a member and
        none has been silent for over ``_QUIET_BEATS`` intervals. Otherwise the others may lag because
        of it; the heartbeat rule judges it, and the next generation restarts their clocks."""
        quiet = _QUIET_BEATS * self.timeouts.beat_interval
        for node_id, incarnation in self._formed:
            member = self.members.get(node_id)
            if member is None or member.incarnation != incarnation:
                return False
            if member.state is FINISHED:
                continue
            if member.state not in IN_GENERATION or now - member.heartbeat_at > quiet:
                return False
        return True

    def next_due(self, after: float) -> float | None:
        """The first deadline at or after ``after`` (monotonic: when :meth:`check` last ran) at which
        :meth:`check` may decide something no request brings about, or ``None``; the scheduler may sleep
        until then. An earlier deadline fired already or waits on a request; one exactly at ``after``
        has not fired, as the rules compare strictly."""
        due = [seen.heard_at + self.timeouts.heartbeat_timeout
               for seen in self.nodes.values() if not seen.judged]
        for member in self._live():
            due.append(member.heartbeat_at + self.timeouts.heartbeat_timeout)
            if member.behind_since is not None and member.state is ALIVE:
                due.append(member.behind_since + self.timeouts.progress_timeout)
        if self._incomplete_since is not None:
            due.append(self._incomplete_since + self.timeouts.cluster_time_out)
        return min((d for d in due if d >= after), default=None)

    def verdicts(self) -> dict[int, str]:
        """rank -> ``heartbeat`` | ``progress``: the workers the supervisor should kill."""
        kinds = {MemberState.LOST: Verdict.HEARTBEAT.value, MemberState.HUNG: Verdict.PROGRESS.value}
        return {m.rank: kinds[m.state] for m in self.members.values() if m.state in kinds}


def _two_highest(steps: Any) -> tuple[int | None, int | None]:
    """The highest and second-highest of the reported steps (``None``: not reported);
    equal steps count twice, so the second equals the first when two members share it."""
    top = heapq.nlargest(2, (step for step in steps if step is not None)) + [None, None]
    return top[0], top[1]


def _highest_of_others(highest: tuple[int | None, int | None], own: int | None) -> int | None:
    """The highest step reported by the members other than one whose step is ``own``,
    in O(1) from :func:`_two_highest`: its own step hides the highest only when it is it."""
    first, second = highest
    return second if own is not None and own == first else first
