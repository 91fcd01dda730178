"""``--straggler_policy=evict``: the membership's verdict on a confirmed straggler.

A straggler is judged as a silent rank is (``lost``, relaunched after its cooldown), but one evicted
again soon after its relaunch is retired: a relaunch does not fix its pace (docs/stragglers.md).
"""

from __future__ import annotations

from recovery.control.members import LIVE_STATES, Member, MemberState, Verdict
from recovery.control.stragglers import Straggler

__all__ = ["StragglerEviction", "retires"]


def retires(measured_from: int | None, since: int, window: int, ranks_left: int,
            min_worker_num: int) -> bool:
    """Whether a straggler evicted now is retired rather than relaunched. ``measured_from``: the step
    its relaunched process was measured from (None: never evicted); ``since``: the step since which it
    stayed above the threshold."""
    return (measured_from is not None and since - measured_from < window
            and ranks_left >= min_worker_num)


class StragglerEviction:
    """Evicts stragglers; the membership's state and its moves are the host class's."""

    members: dict[str, Member]
    worker_num: int
    min_worker_num: int

    def evict_straggler(self, member: Member, found: Straggler, measured_from: int | None,
                        window: int) -> bool:
        """Declare ``member`` lost for its step time, retiring its rank when :func:`retires` says so.
        False (nothing done) unless it is live and the job whole: one eviction at a time, so ranks
        slowed by a recovery under way are not evicted one after another."""
        active = len(self.active_ranks())
        if member.state not in LIVE_STATES or not self.complete or active != self.worker_num:
            return False
        self._move(member, MemberState.LOST)
        self._emit("verdict", **member.fields(), verdict=Verdict.STRAGGLER.value,
                   step_time=round(found.step_time, 6), median=round(found.median, 6),
                   **({} if member.via is None else {"node": member.via}))
        self._start_cooldown(member.node_id, member.rank,
                             f"a straggler: {found.step_time / found.median:.1f}x its peers' step time")
        self._update_completeness()
        if retires(measured_from, found.since, window, active - 1, self.min_worker_num):
            assert measured_from is not None
            self.retire([member.rank], f"rank {member.rank} was evicted as a straggler again "
                                       f"{found.since - measured_from} steps after its relaunch "
                                       f"came back, within --straggler_window={window}")
        return True
