"""The types of a job's timeline, built by timeline.py and drawn by the renderers. Times are unix seconds."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["IncarnationEnding", "SpanPhase", "Lane", "Incarnation", "FaultMark", "PhaseSpan",
           "GenerationMark", "DegradedSpan",
           "Recovery", "StepPoint", "Timeline"]


class IncarnationEnding(StrEnum):
    """How an incarnation (one process of a rank) ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    HUNG = "hung"
    """Declared hung or dead by the scheduler, and killed by tftrun."""
    STOPPED = "stopped"
    """Stopped by tftrun itself (a restart of the group, the end of the job)."""
    RUNNING = "running"
    UNKNOWN = "no exit recorded"
    """The job is over, but its events never recorded this process's end."""


class SpanPhase(StrEnum):
    """What a rank does in a span of the timeline: between a fault and training again, or straggling."""

    COOLDOWN = "cooldown"
    REFORMING = "re-forming"
    RESYNCING = "resynchronising"
    STRAGGLING = "straggling"


@dataclass(frozen=True, order=True)
class Lane:
    node: int
    rank: int


@dataclass(frozen=True)
class Incarnation:
    rank: int
    incarnation: int
    pid: int
    start: float
    end: float
    ending: IncarnationEnding
    exit: str = ""
    """How it ended, as the ``exit`` event says: ``SIGKILL``, ``exit code 1``, or ''."""


@dataclass(frozen=True)
class FaultMark:
    ts: float
    rank: int | None
    cause: str
    pid: int | None = None
    incarnation: int | None = None


@dataclass(frozen=True)
class PhaseSpan:
    rank: int
    phase: SpanPhase
    start: float
    end: float
    generation: int | None = None
    """For re-forming: the generation being formed; for resynchronising: the one formed."""


@dataclass(frozen=True)
class GenerationMark:
    ts: float
    generation: int


@dataclass(frozen=True)
class DegradedSpan:
    """A stretch the job trained with ranks missing (``--min_worker_num``, docs/elastic.md)."""

    start: float
    end: float
    generation: int
    active: tuple[int, ...]
    worker_num: int


@dataclass(frozen=True)
class Recovery:
    """One episode: faults, and how training went on after them."""

    faults: tuple[FaultMark, ...]
    end: float | None
    """The ``recovered`` event; None: not recovered (yet, or ever: a plain script)."""
    source: str | None = None
    seconds: float | None = None
    """As the ``recovered`` event says (since the newest fault)."""
    global_step: int | None = None
    """The step training went on from (the ``recovered`` event's ``step``)."""
    reached: int | None = None
    """The highest step reported before the rollback."""
    restart: str | None = None
    """What tftrun did: ``rank`` (relaunched the dead ranks) or ``workers`` (all)."""

    @property
    def start(self) -> float:
        return self.faults[0].ts

    @property
    def steps_redone(self) -> int | None:
        if self.global_step is None or self.reached is None:
            return None
        return max(0, self.reached - self.global_step)


@dataclass(frozen=True)
class StepPoint:
    ts: float
    global_step: int
    incarnation: int = 0
    """The rank's incarnation that reported it (the newest spawned by then)."""


@dataclass(frozen=True)
class Timeline:
    run_id: str
    start: float
    end: float
    ended: bool
    """Whether a ``job_end`` was seen (on every node given)."""
    running: bool
    """Whether the job still runs (the timeline ends now)."""
    exitcode: int | None
    reason: str
    lanes: tuple[Lane, ...]
    incarnations: tuple[Incarnation, ...]
    faults: tuple[FaultMark, ...]
    phases: tuple[PhaseSpan, ...]
    generations: tuple[GenerationMark, ...]
    recoveries: tuple[Recovery, ...]
    steps: dict[int, tuple[StepPoint, ...]]
    total_steps: int | None
    digests: dict[int, str]
    restarts: int
    relaunches: int
    degraded: tuple[DegradedSpan, ...] = ()
    left_out: int = 0
    """Events not drawn: one of their fields is not of its type (launcher/report/fields.py)."""

    @property
    def nodes(self) -> list[int]:
        return sorted({lane.node for lane in self.lanes})

    @property
    def digests_agree(self) -> bool | None:
        """Whether every rank ended with the same parameters; None before any ended."""
        return None if not self.digests else len(set(self.digests.values())) == 1

    def node_of(self, rank: int) -> int:
        return next((lane.node for lane in self.lanes if lane.rank == rank), 0)
