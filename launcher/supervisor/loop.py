"""The per-node supervisor: start the scheduler and the workers, watch them, restart, stop.

One loop, woken by SIGCHLD, the scheduler's news or every ``monitor_interval``, observes,
asks the restart policy what to do and carries it out. It never waits for the scheduler
and never blocks on a stop (stopping is a state with a deadline), so a death is handled at once.
"""

from __future__ import annotations

import logging
import socket
import time
from contextlib import suppress
from dataclasses import replace
from functools import partial

from launcher.config import LaunchConfig
from launcher.nodes.job_end import JobEnd, heard
from launcher.nodes.link import NodeLink
from launcher.nodes.presence import NodePresence
from launcher.nodes.rounds import RoundMeeting
from launcher.procs.process import Watchdog, become_subreaper, sweep
from launcher.supervisor.absences import absent_since
from launcher.supervisor.actions import WaitUntil
from launcher.supervisor.beats import BeatServer
from launcher.supervisor.carry_out import CarryingOut
from launcher.supervisor.children import Children, node_workers
from launcher.supervisor.closing import Closing, stop_everything_now
from launcher.supervisor.failures import ExitInfo
from launcher.supervisor.job_state import JobState
from launcher.supervisor.job_view import Ending, JobView, RankView
from launcher.supervisor.meeting import MeetingPlace, point_at_remote_scheduler
from launcher.supervisor.observer import Observer, watch_scope
from launcher.supervisor.policy import decide, exit_reports
from launcher.supervisor.signals import Wakeup, handled
from launcher.supervisor.state import Worker
from launcher.supervisor.summary import job_start_fields, live_rows, print_job_summary
from launcher.supervisor.watch import SchedulerWatch, snapshot_interval
from launcher.view.logs import LogFollower
from launcher.view.render import View
from recovery.control.client import SchedulerControl
from recovery.control.node_range import JobDone, Round, TooFew
from recovery.events import EventLog
from recovery.timeouts import Timeouts

__all__ = ["Supervisor", "EXIT_SUPERVISOR_ERROR"]

logger = logging.getLogger(__name__)

EXIT_SUPERVISOR_ERROR = 70
"""tftrun's status when its own loop failed (sysexits' EX_SOFTWARE); it stopped every
process in order first."""


class Supervisor(CarryingOut):
    """Runs one node's share of a job to its end and returns tftrun's exit status."""

    def __init__(self, config: LaunchConfig, store_socket: socket.socket | None,
                 view: View, events: EventLog) -> None:
        self.config = config
        self.view = view
        self.events = events
        self.workers = node_workers(config)
        self.state = JobState()
        self._follower = LogFollower(view.output) if config.join else None
        self.children = Children(config, self._emit, self._follower, store_socket)
        self._nodes = self._node_link() if config.multi_node else None
        """Node 0's cluster store, to agree with the other nodes (only with other nodes)."""
        self._meeting = MeetingPlace(config, self.children.hosts_scheduler, self._nodes)
        # Connected once the workers are started, on one node once something needs it.
        self._control = SchedulerControl(config.master_addr, config.master_port,
                                         config.job_token, connect=False,
                                         run_id=config.run_id, epoch=config.epoch)
        self._wakeup: Wakeup | None = None
        self._watch = SchedulerWatch(
            self._control, self._node_link() if config.multi_node else None, self._wake,
            watch_scope(config), snapshot_interval(config.group_world_size))
        self._presence = (NodePresence(self._node_link(), config.assigned_rank,
                                       config.group_world_size, config.node_range is not None,
                                       self._wake) if config.multi_node else None)
        self._job_end = (JobEnd(self._nodes, config.assigned_rank, config.group_world_size)
                         if self._nodes is not None else None)
        self._rounds = (RoundMeeting(config, self._nodes, self._presence)
                        if config.node_range is not None and self._nodes is not None
                        and self._presence is not None else None)
        self._round: Round | None = None
        """An elastic job's current generation: its nodes."""
        self._round_outcome: TooFew | JobDone | None = None
        self._beats: BeatServer | None = None
        """Takes the workers' heartbeats and beats once for the node (while it runs)."""
        self._observer = Observer(config, self._watch, events.path,
                                  None if self._presence is None else self._presence.tracker)
        self._scheduler_exit = ""
        self._signal: int | None = None
        self._closing: Closing | None = None
        """The fork server and the scheduler being stopped, once the workers are."""

    # ----------------------------------------------------------------- lifecycle
    def _start_beats(self) -> None:
        """Serve the workers' heartbeats on a socket of this node; the workers started
        from now on are told where (``TFT_BEAT_SOCKET``)."""
        config = self.config
        node_name = f"{config.local_addr}/{config.assigned_rank}"[:256]
        self._beats = BeatServer(node_name,
                                 config.master_addr, config.master_port, config.job_token,
                                 config.run_id, config.epoch, Timeouts(
                                     heartbeat_timeout=config.heartbeat_timeout,
                                     progress_timeout=config.progress_timeout),
                                 on_news=self._watch.poke, on_facts=self._watch.facts_heard)
        self.children.beat_socket = self._beats.path
        self._beats.start()

    def run(self) -> int:
        become_subreaper()
        watchdog = self.children.watchdog = Watchdog()
        with handled(self.config.signals_to_handle) as wakeup:
            self._wakeup = wakeup
            self._emit("job_start", **job_start_fields(self.config))
            if self._follower is not None:
                self._follower.start()
            remote = point_at_remote_scheduler(self.config)
            try:
                try:
                    self.children.start_fork_server()
                    self._watch.start()
                    self._start_beats()
                    if self._presence is not None:
                        self._presence.start()
                    if self.children.hosts_scheduler:
                        self.children.start_scheduler()
                    self._start_workers()
                    status = self._loop(wakeup)
                except Exception as error:  # noqa: BLE001 - any bug still stops in order
                    status = self._stop_on_error(error)
            finally:
                self._wakeup = None
                if self._follower is not None:
                    self._follower.stop()
                self._watch.close()
                if self._beats is not None:
                    self._beats.close()
                if self._presence is not None:
                    self._presence.close()
                self._control.close()
                self._meeting.close()
                if remote is not None:
                    remote.remove(self.config.log_dir)
                if self._job_end is not None:
                    self._job_end.leave()
                if self._nodes is not None:
                    self._nodes.close()
                self.view.close()
                watchdog.close()
        return status

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.wake()

    def _loop(self, wakeup: Wakeup) -> int:
        """Observe, let the policy decide, carry out its actions; until the job ended."""
        while True:
            self._advance_round()
            now = time.monotonic()
            wait = self.config.monitor_interval
            for action in decide(self._observe(now), now):
                if isinstance(action, WaitUntil):
                    wait = min(wait, max(0.0, action.at - time.monotonic()))
                else:
                    self._carry_out(action, now)
            self._tell_retirements()
            if self._closing is not None and self._closing.poll():
                return self._finish()
            self._refresh()
            wakeup.wait(wait)

    # ----------------------------------------------------------------- children
    def _node_link(self) -> NodeLink:
        """A link to node 0's cluster store that reports values not the job's (and alerts) as
        events, from whichever thread reads them: the events file only, not the view."""
        config = self.config
        return NodeLink(config.master_addr, config.master_port, config.job_token, config.run_id,
                        config.epoch, partial(self._told, "store_value_refused"),
                        partial(self._told, "alert"))

    def _told(self, event: str, key: str, why: str, count: int) -> None:
        self.events.emit(event, key=key, reason=why, count=count)

    def _unknown_to_scheduler(self) -> frozenset[int]:
        """This node's ranks the scheduler never knew: read from the events file, where it
        writes every registration before answering it."""
        if not self._observer.sees_registrations:
            return frozenset()
        return frozenset(w.rank for w in self.workers
                         if str(w.rank) not in self._observer.registered)

    def _tell_scheduler(self, info: ExitInfo) -> None:
        """Report an exit the scheduler hears of, outside the loop (an orderly stop after
        an error)."""
        for report in exit_reports([info], self._unknown_to_scheduler()):
            self._report_exit(report.exit)

    # ----------------------------------------------------------------- policy
    def _observe(self, now: float) -> JobView:
        """What the policy needs to see; it waits for nothing outside this process."""
        if self._signal is None and self._wakeup is not None:  # kept for the policy
            self._signal = self._wakeup.received()
        self._scheduler_exit = self.children.reap_scheduler()
        self._observer.read(now, self.workers)  # first: as the exits stood before them
        exits = tuple(self.children.reap_workers(self.workers))
        if self._observer.registered or any(w.failure is not None for w in self.workers):
            # Only once a worker registered or failed: before, no answer matters and each
            # question would load the scheduler while the workers start.
            self._control.connect()
        sweep()
        state = self.state
        undecided = state.restart_at is None and state.ending is None
        others_finished, others_step = self._observer.others_finished()
        others_training, others_retired = self._observer.others_training()
        snapshot = self._observer.snapshot
        state.retiring = {rank: at for rank, at in state.retiring.items()
                          if snapshot is None or snapshot.taken_at <= at}
        news = self._watch.nodes
        peer_restart = (f"another node started group restart {news.restarts_started}"
                        if news.restarts_started > self.restart_count else "")
        config = self.config
        peer_done, over = heard(news.over, config.node_rank)
        return JobView(
            tuple(self._rank_view(w, undecided) for w in self.workers), config.max_restarts,
            config.restart_policy, self.restart_count - state.free_restarts, state.relaunches,
            state.restart_at, state.ending, self._signal,
            verdicts=self._observer.verdicts(self.workers) if state.ending is None else {},
            peer_restart=peer_restart, peer_end=news.ended or over, peer_done=peer_done,
            peer_done_at=news.over_at, grace_period=config.grace_period,
            node_rank=config.node_rank, missing=self._observer.node_watch.missing,
            missing_since=self._observer.node_watch.since, node_time_out=config.node_time_out,
            other_ranks=config.worker_num - config.nproc, others_finished=others_finished,
            others_step=others_step, scheduler_exit=self._scheduler_exit,
            scheduler_launches=self.children.scheduler_launches,
            min_worker_num=config.min_worker_num, rejoin_timeout=config.rejoin_timeout,
            others_training=others_training,
            others_retired=others_retired | frozenset(state.retiring),
            lost_ranks=self._observer.lost, exits=exits,
            unknown_to_scheduler=self._unknown_to_scheduler(),
            round_outcome=self._round_outcome,
            round_forming=self._rounds is not None and self._rounds.pending,
            **self._membership_view())

    def _rank_view(self, worker: Worker, undecided: bool) -> RankView:
        """``worker`` as the policy sees it, with when its absence began (kept here from
        pass to pass) and whether it was retired."""
        state = self.state
        seen = self._observer.rank_view(worker, undecided, state.relaunched_after.get(worker.rank))
        seen = replace(seen, retired=worker.rank in state.retired)
        since = absent_since(state.absent_since.get(worker.rank), seen)
        if since is None:
            state.absent_since.pop(worker.rank, None)
        else:
            state.absent_since[worker.rank] = since
        return replace(seen, absent_since=since)

    def _membership_view(self) -> dict[str, object]:
        """Node 0 of an elastic job: its generation's nodes, who asks to join, who beats."""
        if self._round is None or self._presence is None or not self.config.hosts_scheduler:
            return {"node_range": self.config.node_range}
        tracker = self._presence.tracker
        return {"node_range": self.config.node_range, "round_nodes": self._round.nodes,
                "waiting_nodes": self._presence.waiting,
                "silent_since": {node: tracker.silent_since(node) for node in self._round.nodes
                                 if node != self.config.assigned_rank}}

    def _stop_on_error(self, error: Exception) -> int:
        """The loop raised: stop every process in order anyway, so the workers can save
        their last words, then end the job with :data:`EXIT_SUPERVISOR_ERROR`."""
        logger.error("internal error; stopping every process in order", exc_info=error)
        failing = self.state.ending.failing if self.state.ending is not None else None
        self.state.ending = Ending(EXIT_SUPERVISOR_ERROR,
                                   f"supervisor error: {type(error).__name__}: {error}", failing)
        with suppress(Exception):
            stop_everything_now(self.children, self.workers, self._watch, self._tell_scheduler,
                                self.config.grace_period)
        return self._finish()

    def _finish(self) -> int:
        """Emit ``job_end`` and print the summary; tftrun's exit status."""
        ending = self.state.ending
        assert ending is not None
        self._emit("job_end", exitcode=ending.status, reason=ending.reason,
                   restarts=self.restart_count, relaunches=self.state.relaunches)
        self._refresh()
        self.view.close()
        print_job_summary(self.config, self.workers, ending)
        return ending.status

    def _refresh(self) -> None:
        if self.view.wants_rows:
            self.view.show_rows(live_rows(self.config, self.workers, self.state.restart_at,
                                          time.monotonic()))
