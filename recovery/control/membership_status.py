"""What the scheduler's membership tells of itself: the status table ``tftctl status``
prints and a node's status its supervisor reads (docs/protocol.md). A mixin of
:class:`~recovery.control.membership.Membership`, whose tables it reads."""

from __future__ import annotations

from typing import Any

from recovery.control.job_facts import JobFacts
from recovery.control.members import LIVE_STATES, Member, NodeSeen

__all__ = ["StatusViews"]


class StatusViews:
    """The membership's tables as its status replies show them."""

    worker_num: int
    generation: int
    members: dict[str, Member]
    nodes: dict[str, NodeSeen]
    retired: set[int]
    facts_version: int
    _facts: JobFacts | None
    _rank_holders: dict[int, str]
    _incomplete_since: float | None

    def _job_facts(self) -> JobFacts:
        """The job-wide facts, found again (O(members)) only after a change."""
        self._facts = self._facts or JobFacts.of(
            self.worker_num, (m.rank for m in self._live()),
            ((m.rank, m.global_step) for m in self._finished()), self.retired)
        return self._facts

    def incomplete_for(self) -> float:
        """Seconds some rank has had neither a live process nor a finished one."""
        return 0.0 if self._incomplete_since is None else self.clock.monotonic() - self._incomplete_since

    def missing_ranks(self) -> list[int]:
        """Ranks with no live process and no finished one, less the retired ones (the job's facts')."""
        return self._job_facts().missing

    def status(self) -> dict[str, Any]:
        """The membership table, as ``tftctl status`` prints it."""
        now = self.clock.monotonic()
        rows = [self._row(member, now) for member in sorted(self.members.values(), key=lambda m: m.rank)]
        nodes = {node: {"beats": seen.beats, "ranks": seen.ranks, "silent": seen.judged,
                        "heartbeat_age": round(now - seen.heard_at, 3)}
                 for node, seen in sorted(self.nodes.items())}
        return {"worker_num": self.worker_num, "generation": self.generation,
                "complete": self.complete, "missing": self.missing_ranks(), "members": rows,
                "nodes": nodes, "retired": sorted(self.retired)}

    def node_status(self, first_rank: int, nproc: int, missing: bool) -> dict[str, Any]:
        """What a node's supervisor needs: the rows of its ranks ``first_rank`` to ``first_rank + nproc
        - 1``, and of the others only counts and the ranks at fault (with ``missing``, the missing
        ranks). O(own ranks + faults) while the job's facts hold."""
        now = self.clock.monotonic()
        facts = self._job_facts()
        own = range(first_rank, first_rank + nproc)
        rows = [self._row(self.members[holder], now)
                for rank in own if (holder := self._rank_holders.get(rank)) is not None]
        status: dict[str, Any] = {
            "worker_num": self.worker_num, "generation": self.generation,
            "members": rows, "retired": facts.retired,
            "scope": {"first_rank": first_rank, "nproc": nproc},
            "others": facts.others(own), "facts": self.facts_version}
        if missing:
            status["missing"] = facts.missing
            status["missing_known"] = [r for r in facts.missing if r in self._rank_holders]
        return status

    def _row(self, member: Member, now: float) -> dict[str, Any]:
        """``member``'s row of the status table."""
        live = member.state in LIVE_STATES
        return {**member.to_json(),
                "heartbeat_age": round(now - member.heartbeat_at, 3) if live else None,
                "cooldown_left": round(self.cooldown_left(member.node_id), 3)}
