"""The supervisor's hands: carrying out what ``decide()`` returned (signals, launches,
requests to the other nodes and the scheduler); observing stays in launcher/supervisor/loop.py."""

from __future__ import annotations

import logging
import signal

from launcher.config import LaunchConfig
from launcher.nodes.job_end import JobEnd
from launcher.nodes.link import NodeLink
from launcher.nodes.presence import NodePresence
from launcher.nodes.rounds import RoundMeeting
from launcher.procs.spec import Seat
from launcher.supervisor.actions import (
    Action,
    Close,
    GiveUp,
    Hang,
    Kill,
    Relaunch,
    RelaunchScheduler,
    ReportExit,
    RestartAll,
    Retire,
    SchedulerSpent,
    StartAll,
    Stop,
    StopWorkers,
    TeardownCrash,
)
from launcher.supervisor.children import Children
from launcher.supervisor.closing import Closing
from launcher.supervisor.failures import ExitInfo
from launcher.supervisor.job_state import JobState, worker_of
from launcher.supervisor.meeting import MeetingPlace
from launcher.supervisor.state import Worker, WorkerState
from launcher.supervisor.watch import SchedulerWatch
from launcher.view.render import View
from recovery.control.client import ExitReport, Retirement, SchedulerControl
from recovery.control.node_range import JobDone, Round, TooFew, membership_why
from recovery.events import EventLog

__all__ = ["CarryingOut"]

logger = logging.getLogger(__name__)


class CarryingOut:
    """The part of :class:`launcher.supervisor.loop.Supervisor` that acts on processes,
    events and requests; the bookkeeping is :meth:`JobState.apply`'s. The attributes are
    set in the supervisor's ``__init__``."""

    config: LaunchConfig
    view: View
    events: EventLog
    workers: list[Worker]
    children: Children
    state: JobState
    _nodes: NodeLink | None
    _meeting: MeetingPlace
    _control: SchedulerControl
    _watch: SchedulerWatch
    _presence: NodePresence | None
    _rounds: RoundMeeting | None
    _round: Round | None
    _round_outcome: TooFew | JobDone | None
    _closing: Closing | None
    _job_end: JobEnd | None

    @property
    def restart_count(self) -> int:
        return self.children.restart_count

    def _emit(self, event: str, **fields: object) -> None:
        self.view.on_event(self.events.emit(event, **fields))

    def _start_workers(self) -> None:
        """Start this launch's workers; an elastic job's wait for its round first
        (:meth:`_advance_round` starts them once it formed)."""
        if self._rounds is not None:
            self._rounds.begin(self.restart_count, self._round)
        else:
            self._launch_workers()

    def _launch_workers(self) -> None:
        where = self.children.rendezvous = self._meeting.choose(self.restart_count)
        for worker in self.workers:
            self.children.launch(worker)
        self._meeting.serve(self.restart_count, where)
        if self._nodes is not None:
            self._control.connect()

    def _advance_round(self) -> None:
        """An elastic job whose round is forming: look once; once it formed, take it (its
        nodes, so this node's ranks and the world size) and start the workers; a round that
        did not form is the policy's to end the job on. The ``membership`` event carries
        ``generation`` too: the older name of ``restart_count``."""
        if self._rounds is None or not self._rounds.pending or self.state.ending is not None:
            return
        assert self._presence is not None
        met = self._rounds.poll()
        if met is None:
            return
        if not isinstance(met, Round):
            self._round_outcome = met
            return
        nproc, node = self.config.nproc, self.config.assigned_rank
        self.children.restart_count = met.restart_count
        self.children.seat = Seat(met.first_rank(node, nproc), met.world(nproc),
                                  met.nodes.index(node), len(met.nodes))
        before = None if self._round is None else self._round.nodes
        if self.config.hosts_scheduler and (before is None or set(before) != set(met.nodes)):
            self._emit("membership", active=met.active(nproc), world=met.world(nproc),
                       restart_count=met.restart_count, generation=met.restart_count,
                       why=membership_why(before, met.nodes).value,
                       nodes=list(met.nodes))
        self._round = met
        self._presence.next_round = met.restart_count + 1
        self._launch_workers()

    def _carry_out(self, action: Action, now: float) -> None:
        """Record ``action`` in the job's state, then do what it takes outside this process."""
        signals = self._signals_for(action)
        self.state.apply(action, now, self.workers)
        for worker, signum in signals:
            assert worker.child is not None
            worker.child.signal_group(signum)
        match action:
            case Hang(rank, reason):
                worker = worker_of(self.workers, rank)
                self._emit("hang", rank=rank, pid=worker.pid, incarnation=worker.incarnation,
                           reason=reason)
            case Relaunch(rank):
                worker = worker_of(self.workers, rank)
                self._emit("restart", what="rank", why=worker.relaunch_why,
                           restart_count=self.restart_count + self.state.relaunches, ranks=[rank])
                self.children.launch(worker)
            case RestartAll() if self._nodes is not None:
                self._nodes.restart_all(self._next_restart())
            case StartAll():
                self.children.restart_count = self._next_restart()
                self._emit("restart", what="workers", why=self.state.restart_why,
                           restart_count=self.restart_count, ranks=[w.rank for w in self.workers])
                self._start_workers()
            case Stop(_, reason, everywhere, close_rounds):
                if everywhere and self._nodes is not None:
                    self._nodes.end(reason)
                if close_rounds:
                    assert self._nodes is not None and self._presence is not None
                    self._nodes.close_round(self._presence.next_round, ())
                self._job_ending()
            case GiveUp(_, reason):
                if self._nodes is not None:
                    self._nodes.end(f"node {self.config.node_rank}: {reason}")
                self._job_ending()
            case TeardownCrash(rank, failure, step, final_step):
                self._emit("teardown_crash", rank=rank, pid=failure.pid,
                           incarnation=failure.incarnation, cause=failure.cause, step=step,
                           final_step=final_step)
            case ReportExit(info):
                self._report_exit(info)
            case RelaunchScheduler(why):
                self._emit("restart", what="scheduler", why=why,
                           restart_count=self.children.scheduler_launches)
                self.children.start_scheduler()
            case SchedulerSpent(why):
                logger.error("%s; its restart budget is spent", why)
            case Close():
                if self._closing is None and (self._job_end is None or self._job_end.may_close()):
                    self._closing = Closing(self.children, self._watch, self.config.grace_period)

    def _signals_for(self, action: Action) -> list[tuple[Worker, int]]:
        """The workers ``action`` signals, as their states stand before it is applied."""
        match action:
            case Hang(rank) | Kill(rank):
                return [(worker_of(self.workers, rank), signal.SIGKILL)]
            case Retire(rank):
                return [(w, signal.SIGTERM) for w in self.workers
                        if w.rank == rank and w.state is WorkerState.RUNNING]
            case StopWorkers(signum, deadlines):
                return [(w, signum) for w in self.workers
                        if w.state is WorkerState.RUNNING and w.rank in deadlines]
        return []

    def _report_exit(self, info: ExitInfo) -> None:
        """Queue the worker's exit for the scheduler (the watch thread delivers it, so the
        loop never waits for the scheduler)."""
        assert info.rank is not None
        self._watch.report(ExitReport(str(info.rank), info.rank, info.pid, info.incarnation,
                                      not (info.expected or info.succeeded), info.describe()))

    def _tell_retirements(self) -> None:
        """Tell the scheduler the ranks retired in this pass, in one request."""
        if retirements := self.state.take_retirements():
            ranks, whys = zip(*retirements, strict=True)
            self._watch.report(Retirement(list(ranks), "; ".join(dict.fromkeys(whys))))

    def _next_restart(self) -> int:
        """The next group restart's number: with other nodes, every node's workers of one restart carry it."""
        return max(self.restart_count + 1, self._watch.nodes.restarts_started)

    def _job_ending(self) -> None:
        """The job ends (the state holds why): the other nodes hear of it; the fork server
        and the scheduler follow the workers (Close)."""
        ending = self.state.ending
        assert ending is not None
        if self._rounds is not None:
            self._rounds.abandon()
        if self._job_end is not None:
            self._job_end.ending(ending.status, ending.reason)
