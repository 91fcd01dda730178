"""The scheduler's end of straggler detection: beats in, ``straggler`` events out.

The detector starts afresh with each generation (the ranks' shares of a step change with it); under
``--straggler_policy=evict`` a straggler is judged lost, or retired (recovery/control/eviction.py).
"""

from __future__ import annotations

from typing import Any

from recovery.control.members import LIVE_STATES
from recovery.control.membership import Membership
from recovery.control.stragglers import Straggler, StragglerDetector, StragglerSettings
from recovery.events import EventLog

__all__ = ["StragglerWatch"]


class StragglerWatch:
    """Feeds the detector with the beats of the live members of ``membership``."""

    def __init__(self, settings: StragglerSettings, membership: Membership,
                 events: EventLog) -> None:
        self.detector = StragglerDetector(settings)
        self._membership = membership
        self._events = events
        self._holders: dict[int, tuple[int, int]] = {}
        """Each rank's process (pid, incarnation) as of its last summary."""
        self._measured_from: dict[int, int | None] = {}
        """Each evicted rank: the global step from which the process that replaced it was
        measured (its first step after its warm-up; None until it sent one)."""
        self._generation: int | None = None

    def heard(self, beat: dict[str, Any], node: str | None) -> None:
        """A beat's checked fields (its identity, ``step``, ``step_us``, ``steps``), sent
        by ``node`` (its supervisor's name, or its host when it beat by itself)."""
        steps, step_us, step = beat["steps"], beat["step_us"], beat["step"]
        member = self._membership.members.get(beat["node_id"] or "")
        if steps is None or step_us is None or step is None or member is None or member.state not in LIVE_STATES \
                or member.pid != beat["pid"] or member.incarnation != beat["incarnation"]:
            return
        if self._membership.generation != self._generation:
            self._generation = self._membership.generation
            self.detector.reset()
        holder = (member.pid, member.incarnation)
        if self._holders.get(member.rank) != holder:
            # A new process: its first summary is its peers' reference, never a straggler's.
            self._holders[member.rank] = holder
            self.detector.warming_up(member.rank, step_us / 1e6)
            if member.rank in self._measured_from and self._measured_from[member.rank] is None:
                self._measured_from[member.rank] = step + 1
            return
        found = self.detector.heard(member.rank, step, step_us / 1e6, steps)
        if found is None:
            return
        self._events.emit("straggler", **_straggler_json(found), node=node or beat["host"])
        settings = self.detector.settings
        if settings.policy == "evict" and self._membership.evict_straggler(
                member, found, self._measured_from.get(member.rank), settings.window):
            self.detector.forget(member.rank)  # gone: its times are no peer's to compare with
            self._measured_from[member.rank] = None

    def to_json(self) -> list[dict[str, Any]]:
        """The ranks named and not yet back under the threshold (``tftctl status``)."""
        return [_straggler_json(s) for s in sorted(self.detector.named.values(),
                                                     key=lambda s: s.rank)]


def _straggler_json(straggler: Straggler) -> dict[str, Any]:
    return {"rank": straggler.rank, "step_time": round(straggler.step_time, 6),
            "median": round(straggler.median, 6), "since": straggler.since}
