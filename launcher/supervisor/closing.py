"""The last of a job on this node: once no worker runs, the fork server and the scheduler
stopped in order without blocking the loop; the error path (:func:`stop_everything_now`)
blocks, and stops the scheduler last because the workers' last words need it."""

from __future__ import annotations

import signal
from collections.abc import Callable

from launcher.procs.process import Child, Stopping, stop_all
from launcher.procs.spec import Role
from launcher.supervisor.children import Children
from launcher.supervisor.failures import ExitInfo
from launcher.supervisor.state import Worker
from launcher.supervisor.watch import SchedulerWatch

__all__ = ["Closing", "stop_everything_now", "REPORTS_WAIT"]

REPORTS_WAIT = 2.0
"""Seconds the job's end waits for the last exit reports to reach the scheduler."""


class Closing:
    """The fork server and the scheduler being stopped; :meth:`poll` until it returns True."""

    def __init__(self, children: Children, watch: SchedulerWatch, grace_period: float) -> None:
        self._children = children
        watch.delivered(REPORTS_WAIT)
        self._scheduler: Child | None = children.scheduler
        children.scheduler = None
        stopped = [c for c in (children.stop_fork_server(), self._scheduler) if c is not None]
        self._stopping = Stopping(stopped, signal.SIGTERM, grace_period)

    def poll(self) -> bool:
        """True once all ended (their ``exit`` events written)."""
        if not self._stopping.poll():
            return False
        _record(self._children, self._scheduler)
        return True


def _record(children: Children, scheduler: Child | None) -> None:
    if scheduler is not None:
        children.exit_info(Role.SCHEDULER, None, scheduler, children.scheduler_launches - 1,
                           scheduler.process.returncode, expected=True)


def stop_everything_now(children: Children, workers: list[Worker], watch: SchedulerWatch,
                        tell: Callable[[ExitInfo], None], grace_period: float) -> None:
    """The blocking stop of the error path: workers and the fork server, then the scheduler; each
    worker's end is told the scheduler (``tell``) before it is stopped."""
    running = [w for w in workers if w.child is not None and w.child.poll() is None]
    server = children.stop_fork_server()
    stop_all([*(w.child for w in running if w.child), *([server] if server is not None else [])],
             signal.SIGTERM, grace_period)
    for worker in running:
        assert worker.child is not None
        worker.last_exit = children.exit_info(Role.WORKER, worker.rank, worker.child,
                                              worker.incarnation,
                                              worker.child.process.returncode, expected=True)
        tell(worker.last_exit)
    watch.delivered(REPORTS_WAIT)
    scheduler, children.scheduler = children.scheduler, None
    if scheduler is not None:
        stop_all([scheduler], signal.SIGTERM, grace_period)
    _record(children, scheduler)
