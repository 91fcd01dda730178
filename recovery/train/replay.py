"""Replaying a run's membership changes from its ``events.jsonl``, so that a degraded run is reproducible:
with the same seed and membership step for step, gloo's all-reduce gives the same sums. A rank lost
after step ``S`` is SIGKILLed before ``S + 1``; a generation grown at ``S`` is joined once ``S`` commits."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from recovery.events import read_events

__all__ = ["MembershipChange", "MembershipReplay", "ReplayError", "BeforeStep",
           "recorded_changes"]


class ReplayError(ValueError):
    """The record cannot be replayed (a change of a kind the replay does not make)."""


@dataclass(frozen=True)
class MembershipChange:
    """One generation of a recorded run, and the committed step it trained from."""

    generation: int
    active: tuple[int, ...]
    world: int
    why: str
    lost: tuple[int, ...]
    joined: tuple[int, ...]
    step: int | None
    """The last global step committed before the generation's first step; ``None`` when it never trained."""


def recorded_changes(events: Iterable[dict[str, Any]]) -> list[MembershipChange]:
    """Each generation's first ``membership`` event (not a later retirement), with the step of its first
    ``rollback``; the first generation's is 0 unless a rollback says otherwise (a resumed job)."""
    memberships: dict[int, dict[str, Any]] = {}
    steps: dict[int, int] = {}
    for event in events:
        if event.get("event") == "membership":
            memberships.setdefault(int(event["generation"]), event)
        elif event.get("event") == "rollback":
            steps.setdefault(int(event["generation"]), int(event["step"]))
    return [MembershipChange(generation, tuple(event["active"]), int(event["world"]),
                             str(event["why"]), tuple(event.get("lost", ())),
                             tuple(event.get("joined", ())),
                             steps.get(generation, 0 if index == 0 else None))
            for index, (generation, event) in enumerate(sorted(memberships.items()))]


class BeforeStep(Enum):
    """What a rank does before its next step, in a replay."""

    GO = "go"
    """Train the step in the current generation."""
    KILL = "kill"
    """Die (SIGKILL): the record lost this rank after the last committed step."""
    LEAVE = "leave"
    """Leave the group for the next generation: it is due at the last committed step."""


class MembershipReplay:
    """The changes of a recorded run, and what a rank must do to make them again."""

    def __init__(self, changes: list[MembershipChange]) -> None:
        for change in changes[1:]:
            if bool(change.lost) == bool(change.joined):
                raise ReplayError(
                    f"generation {change.generation} ({change.why}: lost {list(change.lost)}, "
                    f"joined {list(change.joined)}) cannot be replayed: only changes that "
                    "lose ranks or that take ranks in are")
            if change.step is None:
                raise ReplayError(f"generation {change.generation} never trained (no rollback "
                                  "event): it cannot be replayed")
        self.changes = changes

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MembershipReplay:
        """The record in ``path`` (an ``events.jsonl``, or the log dir holding it); raises ReplayError for no
        ``membership`` event, a change the replay cannot make, or a retirement (the rank would come back)."""
        events = list(read_events(path))
        retired = [e for e in events if e.get("event") == "membership" and e.get("retired")]
        if retired:
            raise ReplayError(f"{path}: ranks {retired[0]['retired']} were retired; retirements "
                              "are not replayed")
        changes = recorded_changes(events)
        if not changes:
            raise ReplayError(f"{path}: no membership event to replay")
        return cls(changes)

    def next_change(self, generation: int) -> MembershipChange | None:
        """The first recorded change after ``generation``, if any."""
        return next((c for c in self.changes if c.generation > generation), None)

    def before_step(self, rank: int, generation: int, committed: int,
                    newer: bool) -> BeforeStep:
        """What ``rank``, a member of ``generation`` that committed step ``committed``,
        does before the next step; ``newer``: the scheduler formed a newer generation."""
        change = self.next_change(generation)
        if change is not None and committed == change.step:
            if rank in change.lost:
                return BeforeStep.KILL
            if change.joined:
                return BeforeStep.LEAVE
        return BeforeStep.GO if not newer or self.holds(generation, committed) else BeforeStep.LEAVE

    def holds(self, generation: int, committed: int) -> bool:
        """Whether a newer generation must wait for the members of ``generation``: the
        record takes ranks in only after step ``committed``."""
        change = self.next_change(generation)
        return (change is not None and bool(change.joined) and change.step is not None
                and committed < change.step)

    def diverged(self, generation: int, active: tuple[int, ...], committed: int) -> str | None:
        """How a generation just joined (its members holding step ``committed``) differs
        from the record, or ``None``."""
        change = next((c for c in self.changes if c.generation == generation), None)
        if change is None:
            return f"generation {generation} is not in the record"
        if (change.active, change.step) != (active, committed):
            return (f"generation {generation} has ranks {list(active)} from step {committed}; "
                    f"the record has {list(change.active)} from step {change.step}")
        return None
