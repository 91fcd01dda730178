"""The supervisor's view of one worker process: its state and its launches."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from launcher.failures import ExitInfo
from launcher.process import Child

__all__ = ["WorkerState", "Worker"]


class WorkerState(str, Enum):
    """Where a worker is, as the supervisor sees it.

    ``PENDING`` → ``RUNNING`` → ``SUCCEEDED`` (exit 0) | ``FAILED`` (any other end).
    Stopping on purpose: ``RUNNING`` → ``STOPPING`` → ``STOPPED``. A worker about to be
    launched again waits in ``COOLDOWN`` (from ``FAILED`` or ``STOPPED``) and goes back
    to ``RUNNING`` with a new incarnation.
    """

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"
    COOLDOWN = "cooldown"


_LEGAL = {
    WorkerState.PENDING: {WorkerState.RUNNING},
    WorkerState.RUNNING: {WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.STOPPING},
    WorkerState.STOPPING: {WorkerState.STOPPED, WorkerState.SUCCEEDED, WorkerState.FAILED},
    WorkerState.SUCCEEDED: {WorkerState.COOLDOWN, WorkerState.RUNNING},
    WorkerState.FAILED: {WorkerState.COOLDOWN, WorkerState.RUNNING},
    WorkerState.STOPPED: {WorkerState.COOLDOWN, WorkerState.RUNNING},
    WorkerState.COOLDOWN: {WorkerState.RUNNING},
}


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
    cooldown_until: float = 0.0
    relaunch_why: str = ""

    @property
    def pid(self) -> int | None:
        return None if self.child is None else self.child.pid

    @property
    def restarts(self) -> int:
        return max(0, self.launches - 1)

    def transition(self, to: WorkerState) -> None:
        if to not in _LEGAL[self.state]:
            raise RuntimeError(f"rank {self.rank}: illegal move {self.state.value} -> {to.value}")
        self.state = to
