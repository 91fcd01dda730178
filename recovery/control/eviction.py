"""``--straggler_policy=evict``: the membership's verdict on a confirmed straggler.

The straggler is judged as a silent rank is: ``lost``, with a ``verdict`` event
(``verdict: straggler``) and its cooldown. Its node's supervisor kills it and relaunches
it after the cooldown; the survivors go on degraded meanwhile (docs/stragglers.md).
"""

from __future__ import annotations

from recovery.control.members import LIVE_STATES, Member, MemberState, Verdict

__all__ = ["StragglerEviction"]


class StragglerEviction:
    """Evicts stragglers; the membership's state and its moves (``_move``, ``_emit``,
    ``_start_cooldown``, ``_update_completeness``) are the host class's."""

    members: dict[str, Member]
    worker_num: int

    def evict_straggler(self, member: Member, step_time: float, median: float) -> bool:
        """Declare ``member`` lost for its step time; False (nothing done) when it is no
        longer live, or the job is not whole: one eviction at a time, so that ranks slowed
        by a recovery under way are never evicted one after another."""
        if member.state not in LIVE_STATES or not self.complete \
                or len(self.active_ranks()) != self.worker_num:
            return False
        self._move(member, MemberState.LOST)
        self._emit("verdict", **member.fields(), verdict=Verdict.STRAGGLER.value,
                   step_time=round(step_time, 6), median=round(median, 6),
                   **({} if member.via is None else {"node": member.via}))
        self._start_cooldown(member.node_id, member.rank,
                             f"a straggler: {step_time / median:.1f}x its peers' step time")
        self._update_completeness()
        return True
