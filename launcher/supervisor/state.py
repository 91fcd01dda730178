"""The supervisor's view of one worker process: its state, its deadline, its last failure. The
restart policy (launcher/supervisor/policy.py) reads these; the supervisor moves them only
through :meth:`Worker.transition`, so that the table below is what the code does."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from launcher.procs.process import Child
from launcher.supervisor.failures import ExitInfo
from recovery.transitions import check_transition

__all__ = ["WorkerState", "Worker", "Failure", "TRANSITIONS", "SPAWN_FAILED"]


class WorkerState(StrEnum):
    """Where a worker is, as the supervisor sees it. ``COOLDOWN`` (a relaunch charged, waiting
    out the re-registration cooldown) and ``STOPPING`` (signalled, SIGKILLed then) wait for
    :attr:`Worker.deadline`; ``STOPPED``: stopped on purpose, its relaunch withdrawn, or retired."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"
    COOLDOWN = "cooldown"


_LAUNCHED = {WorkerState.RUNNING, WorkerState.FAILED}
"""A launch ends in RUNNING, or in FAILED when the process could not be started."""

TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.PENDING: frozenset(_LAUNCHED),
    WorkerState.RUNNING: frozenset({WorkerState.SUCCEEDED, WorkerState.FAILED,
                                    WorkerState.STOPPING}),
    WorkerState.STOPPING: frozenset({WorkerState.STOPPED}),
    WorkerState.SUCCEEDED: frozenset(_LAUNCHED),
    WorkerState.FAILED: frozenset({WorkerState.COOLDOWN, WorkerState.STOPPED, *_LAUNCHED}),
    WorkerState.STOPPED: frozenset(_LAUNCHED),
    WorkerState.COOLDOWN: frozenset({WorkerState.STOPPED, *_LAUNCHED}),
}


SPAWN_FAILED = 127
"""tftrun's exit status when the job ends on a worker that could not be started (the
shell's "cannot execute")."""


@dataclass(frozen=True)
class Failure:
    """Why a worker is FAILED: its process ended unexpectedly, or could not be started."""

    rank: int
    pid: int | None
    incarnation: int
    at: float
    returncode: int | None
    """Popen's (negative for a signal); None when the process could not be started."""
    reason: str
    """One phrase: ``killed by SIGKILL (...)``, ``could not be started: ...``."""
    cause: str
    """The ``fault`` event's cause: a signal name, ``exit code N``, ``hang``, ``spawn``."""
    exit_status: int
    """The status tftrun exits with when this failure ends the job."""

    @classmethod
    def of_exit(cls, info: ExitInfo, hung: bool) -> Failure:
        assert info.rank is not None
        cause = "hang" if hung else (info.signal_name or f"exit code {info.returncode}")
        return cls(info.rank, info.pid, info.incarnation, info.at, info.returncode,
                   info.describe(), cause, info.exit_status)

    @classmethod
    def of_spawn(cls, rank: int, incarnation: int, at: float, error: OSError) -> Failure:
        return cls(rank, None, incarnation, at, None, f"could not be started: {error}",
                   "spawn", SPAWN_FAILED)


@dataclass
class Worker:
    """One rank on this node across all of its launches."""

    rank: int
    local_rank: int
    state: WorkerState = WorkerState.PENDING
    child: Child | None = None
    incarnation: int = -1
    launches: int = 0
    last_exit: ExitInfo | None = None
    failure: Failure | None = None
    """Set while FAILED (and kept while a relaunch waits in COOLDOWN)."""
    deadline: float = 0.0
    """COOLDOWN: when the relaunch is due; STOPPING: when it is SIGKILLed."""
    hung: bool = False
    """The scheduler declared this incarnation dead or hung and it was SIGKILLed."""
    relaunch_why: str = ""

    @property
    def pid(self) -> int | None:
        return None if self.child is None else self.child.pid

    @property
    def restarts(self) -> int:
        return max(0, self.launches - 1)

    def transition(self, to: WorkerState, deadline: float = 0.0) -> None:
        check_transition(TRANSITIONS, f"rank {self.rank}", self.state, to)
        self.state = to
        self.deadline = deadline

    def launched(self, child: Child) -> None:
        """A new incarnation runs as ``child``."""
        self.transition(WorkerState.RUNNING)
        self.child, self.failure, self.hung = child, None, False
        self.launches += 1

    def launch_failed(self, failure: Failure) -> None:
        """The new incarnation's process could not be started: a failed launch."""
        self.transition(WorkerState.FAILED)
        self.child, self.failure, self.hung = None, failure, False
        self.launches += 1

    def ended(self, info: ExitInfo) -> None:
        """Its process ended: SUCCEEDED, FAILED (unexpected), or STOPPED (we stopped it)."""
        self.last_exit = info
        if self.state is WorkerState.STOPPING:
            self.transition(WorkerState.STOPPED)
        elif info.succeeded:
            self.transition(WorkerState.SUCCEEDED)
        else:
            self.transition(WorkerState.FAILED)
            self.failure = Failure.of_exit(info, self.hung)
