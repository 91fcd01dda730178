"""The supervisor's hands: carrying out what ``decide()`` returned (signals, launches,
requests to the other nodes and the scheduler); observing stays in launcher/supervisor/loop.py."""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping

from launcher.config import LaunchConfig
from launcher.nodes.job_end import JobEnd
from launcher.nodes.link import NodeLink
from launcher.nodes.presence import NodePresence
from launcher.nodes.rounds import RoundMeeting
from launcher.procs.spec import Seat
from launcher.supervisor.actions import (
    EXIT_PEER_ENDED,
    Action,
    Close,
    GiveUp,
    Hang,
    Kill,
    Relaunch,
    RelaunchScheduler,
    RestartAll,
    Retire,
    ScheduleRelaunch,
    SchedulerSpent,
    StartAll,
    Stop,
    StopWorkers,
    TeardownCrash,
)
from launcher.supervisor.children import Children
from launcher.supervisor.closing import Closing
from launcher.supervisor.job_view import Ending
from launcher.supervisor.meeting import MeetingPlace
from launcher.supervisor.policy import RESTART_GRACE
from launcher.supervisor.state import Failure, Worker, WorkerState
from launcher.supervisor.watch import SchedulerWatch
from launcher.view.render import View
from recovery.control.client import Retirement, SchedulerControl
from recovery.control.node_range import JobDone, Round, TooFew, membership_why
from recovery.events import EventLog

__all__ = ["CarryingOut"]

logger = logging.getLogger(__name__)


class CarryingOut:
    """The part of :class:`launcher.supervisor.loop.Supervisor` that acts: starting the
    workers (an elastic job's round first) and carrying out each action, the state moves
    through ``Worker.transition``; the attributes are the supervisor's, set in its
    ``__init__``."""

    config: LaunchConfig
    view: View
    events: EventLog
    workers: list[Worker]
    children: Children
    relaunches: int
    _nodes: NodeLink | None
    _meeting: MeetingPlace
    _control: SchedulerControl
    _watch: SchedulerWatch
    _presence: NodePresence | None
    _rounds: RoundMeeting | None
    _round: Round | None
    _free_restarts: int
    _restart_at: float | None
    _restart_why: str
    _relaunched_after: dict[int, Failure]
    _retired: set[int]
    _retiring: dict[int, float]
    _retirements: list[tuple[int, str]]
    _ending: Ending | None
    _closing: Closing | None
    _job_end: JobEnd | None

    @property
    def restart_count(self) -> int:
        return self.children.restart_count

    def _emit(self, event: str, **fields: object) -> None:
        self.view.on_event(self.events.emit(event, **fields))

    def _start_workers(self) -> None:
        if self._rounds is not None and not self._meet_round():
            return
        where = self.children.rendezvous = self._meeting.choose(self.restart_count)
        for worker in self.workers:
            self.children.launch(worker)
        self._meeting.serve(self.restart_count, where)
        if self._nodes is not None:
            self._control.connect()

    def _meet_round(self) -> bool:
        """An elastic job: take this launch's round (its nodes, so this node's ranks and the
        world size); False when the job ends instead, or a signal came in. Its ``membership``
        event says ``restart_count``, and ``generation`` too (its older spelling, for one
        release): a round is a group restart, not one of the scheduler's generations."""
        assert self._rounds is not None and self._presence is not None
        met = self._rounds.meet(self.restart_count, self._round)
        if isinstance(met, TooFew):
            if self._nodes is not None and self.config.hosts_scheduler:
                self._nodes.end(met.reason)
            self._end(Ending(EXIT_PEER_ENDED, met.reason))
        elif isinstance(met, JobDone):
            self._end(Ending(0, met.reason))
        if not isinstance(met, Round):
            return False
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
        return True

    def _rounds_closed(self) -> None:
        """Node 0 of an elastic job that ended well: a node waiting to join the next
        generation learns that none comes (torchrun closes its rendezvous likewise)."""
        assert self._nodes is not None and self._presence is not None
        self._nodes.close_round(self._presence.next_round, ())

    def _carry_out(self, action: Action, now: float) -> None:
        """Do what the policy decided; the state moves go through ``Worker.transition``."""
        match action:
            case Hang(rank, reason):
                worker = self._worker(rank)
                assert worker.child is not None
                self._emit("hang", rank=rank, pid=worker.pid, incarnation=worker.incarnation,
                           reason=reason)
                worker.hung = True
                # SIGKILL: a hung or stopped process may never act on a gentler signal.
                worker.child.signal_group(signal.SIGKILL)
            case ScheduleRelaunch(rank, at, why):
                worker = self._worker(rank)
                worker.transition(WorkerState.COOLDOWN, deadline=at)
                worker.relaunch_why = why
            case Relaunch(rank):
                worker = self._worker(rank)
                assert worker.failure is not None
                self._relaunched_after[rank] = worker.failure
                self.relaunches += 1
                self._emit("restart", what="rank", why=worker.relaunch_why,
                           restart_count=self.restart_count + self.relaunches, ranks=[rank])
                self.children.launch(worker)
            case Retire(rank, why):
                self._retire(rank, why, now)
            case RestartAll(at, why, charged):
                self._restart_at, self._restart_why = at, why
                if not charged:
                    self._free_restarts += 1
                if self._nodes is not None:
                    news = self._watch.nodes
                    self._nodes.restart_all(max(self.restart_count + 1, news.restarts_started))
            case StopWorkers(signum, deadlines):
                self._stop_workers(signum, deadlines)
            case StartAll():
                self._restart_all()
            case Stop(status, reason, everywhere):
                if everywhere and self._nodes is not None:
                    self._nodes.end(reason)
                if status == 0 and self._round is not None and self.config.hosts_scheduler:
                    self._rounds_closed()
                self._end(Ending(status, reason))
            case GiveUp(failure, reason):
                if self._nodes is not None:
                    self._nodes.end(f"node {self.config.node_rank}: {reason}")
                self._end(Ending(failure.exit_status, reason, failure))
            case TeardownCrash(rank, failure, step, final_step):
                self._emit("teardown_crash", rank=rank, pid=failure.pid,
                           incarnation=failure.incarnation, cause=failure.cause, step=step,
                           final_step=final_step)
            case Kill(rank):
                child = self._worker(rank).child
                assert child is not None
                child.signal_group(signal.SIGKILL)
            case RelaunchScheduler(why):
                self._emit("restart", what="scheduler", why=why,
                           restart_count=self.children.scheduler_launches)
                self.children.start_scheduler()
            case SchedulerSpent(why):
                logger.error("%s; its restart budget is spent", why)
            case Close():
                if self._closing is None and (self._job_end is None or self._job_end.may_close()):
                    self._closing = Closing(self.children, self._watch, self.config.grace_period)

    def _retire(self, rank: int, why: str, now: float) -> None:
        """Take ``rank`` out of the job for good: this node's rank has its relaunch
        withdrawn (or stopped, if it is starting); the scheduler is told (it awaits the
        rank no more, and writes the ``membership`` event)."""
        self._retirements.append((rank, why))
        worker = next((w for w in self.workers if w.rank == rank), None)
        if worker is None:  # a lost node's rank
            self._retiring[rank] = now
            return
        self._retired.add(rank)
        if worker.state is WorkerState.RUNNING and worker.child is not None:
            worker.transition(WorkerState.STOPPING,
                              deadline=now + min(self.config.grace_period, RESTART_GRACE))
            worker.child.signal_group(signal.SIGTERM)
        elif worker.state in (WorkerState.FAILED, WorkerState.COOLDOWN):
            worker.transition(WorkerState.STOPPED)

    def _tell_retirements(self) -> None:
        """Tell the scheduler the ranks retired in this pass, in one request."""
        if self._retirements:
            ranks, whys = zip(*self._retirements, strict=True)
            self._watch.report(Retirement(list(ranks), "; ".join(dict.fromkeys(whys))))
            self._retirements = []

    def _worker(self, rank: int) -> Worker:
        return next(w for w in self.workers if w.rank == rank)

    def _stop_workers(self, signum: int, deadlines: Mapping[int, float]) -> None:
        """Signal each running worker (STOPPING until its deadline, then the policy
        SIGKILLs it); withdraw every relaunch waiting in COOLDOWN."""
        for worker in self.workers:
            if worker.state is WorkerState.RUNNING and worker.child is not None \
                    and worker.rank in deadlines:
                worker.transition(WorkerState.STOPPING, deadline=deadlines[worker.rank])
                worker.child.signal_group(signum)
            elif worker.state is WorkerState.COOLDOWN:
                worker.transition(WorkerState.STOPPED)

    def _restart_all(self) -> None:
        self._restart_at = None
        self._relaunched_after.clear()
        self._retired.clear()  # a group restart starts every rank: the retired ones too
        # With other nodes, every node's workers of one restart carry its number.
        self.children.restart_count = max(self.restart_count + 1,
                                          self._watch.nodes.restarts_started)
        self._emit("restart", what="workers", why=self._restart_why,
                   restart_count=self.restart_count, ranks=[w.rank for w in self.workers])
        self._start_workers()

    def _end(self, ending: Ending) -> None:
        """The job ends: the workers are stopped (StopWorkers); the fork server and the
        scheduler follow (Close)."""
        self._ending, self._restart_at = ending, None
        if self._job_end is not None:
            self._job_end.ending(ending.status, ending.reason)
