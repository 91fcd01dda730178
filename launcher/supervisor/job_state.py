"""The supervisor's bookkeeping between two passes, moved only by the actions decide() returns.

:meth:`JobState.apply` is pure (it starts, signals or writes nothing), so that the Hypothesis
state machine of the restart policy drives the same object the supervisor does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from launcher.supervisor.actions import (
    Action,
    GiveUp,
    Hang,
    Relaunch,
    RestartAll,
    Retire,
    ScheduleRelaunch,
    StartAll,
    Stop,
    StopWorkers,
)
from launcher.supervisor.job_view import Ending
from launcher.supervisor.state import Failure, Worker, WorkerState

__all__ = ["JobState", "worker_of"]


@dataclass
class JobState:
    """What the policy's next view is built from, beside the workers' own states."""

    relaunches: int = 0
    """Relaunches of single ranks (per-rank recovery)."""
    free_restarts: int = 0
    """Group restarts for a change of an elastic job's nodes: not charged to the budget."""
    restart_at: float | None = None
    restart_why: str = ""
    relaunched_after: dict[int, Failure] = field(default_factory=dict)
    """Ranks relaunched alone since the last group restart: the failure each followed."""
    absent_since: dict[int, float] = field(default_factory=dict)
    """Absent ranks: when each one's absence began (absences.absent_since)."""
    retired: set[int] = field(default_factory=set)
    """This node's ranks retired for good since the last group restart."""
    retiring: dict[int, float] = field(default_factory=dict)
    """Other nodes' ranks this node retired, until a scheduler snapshot taken after the
    scheduler was told shows it: rank → when (monotonic)."""
    retirements: list[tuple[int, str]] = field(default_factory=list)
    """Ranks retired in this pass, and why: told the scheduler together."""
    ending: Ending | None = None

    def apply(self, action: Action, now: float, workers: Sequence[Worker]) -> None:
        """Record ``action``; the processes are the caller's to start or signal."""
        match action:
            case Hang(rank):
                worker_of(workers, rank).hung = True
            case ScheduleRelaunch(rank, at, why):
                worker = worker_of(workers, rank)
                worker.transition(WorkerState.COOLDOWN, deadline=at)
                worker.relaunch_why = why
            case Relaunch(rank):
                failure = worker_of(workers, rank).failure
                assert failure is not None, f"rank {rank} relaunched without a failure"
                self.relaunched_after[rank] = failure
                self.relaunches += 1
            case Retire(rank, why, deadline):
                self.retirements.append((rank, why))
                worker = next((w for w in workers if w.rank == rank), None)
                if worker is None:  # a lost node's rank
                    self.retiring[rank] = now
                    return
                self.retired.add(rank)
                if worker.state is WorkerState.RUNNING:
                    worker.transition(WorkerState.STOPPING, deadline=deadline)
                elif worker.state in (WorkerState.FAILED, WorkerState.COOLDOWN):
                    worker.transition(WorkerState.STOPPED)
            case RestartAll(at, why, charged):
                self.restart_at, self.restart_why = at, why
                self.free_restarts += not charged
            case StopWorkers(_, deadlines):
                for worker in workers:
                    if worker.state is WorkerState.RUNNING and worker.rank in deadlines:
                        worker.transition(WorkerState.STOPPING, deadline=deadlines[worker.rank])
                    elif worker.state is WorkerState.COOLDOWN:
                        worker.transition(WorkerState.STOPPED)
            case StartAll(back):
                self.restart_at = None
                self.relaunched_after.clear()
                self.retired -= back
            case Stop(status, reason):
                self.ending, self.restart_at = Ending(status, reason), None
            case GiveUp(failure, reason):
                self.ending, self.restart_at = Ending(failure.exit_status, reason, failure), None

    def take_retirements(self) -> list[tuple[int, str]]:
        """The retirements of this pass, to tell the scheduler; forgotten here."""
        taken, self.retirements = self.retirements, []
        return taken


def worker_of(workers: Sequence[Worker], rank: int) -> Worker:
    """This node's worker of ``rank``."""
    return next(w for w in workers if w.rank == rank)
