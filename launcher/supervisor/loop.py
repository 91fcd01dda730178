"""The per-node supervisor: start the scheduler and the workers, watch them, restart, stop.

One loop, woken by SIGCHLD (so a death is seen at once, not at the next poll) or every
``monitor_interval``: observe (queued signals, exits, the scheduler's verdicts and
registrations), ask the restart policy (launcher/supervisor/policy.py) what to do, carry out its
actions, redraw the view. The loop never sleeps inside a decision and never blocks on a
stop: stopping is a state with a deadline. Signal handlers only queue the signal number.
An unexpected exception still ends in the orderly stop (:meth:`Supervisor._stop_on_error`).
"""

from __future__ import annotations

import logging
import os
import queue
import select
import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial

from launcher.config import LaunchConfig
from launcher.supervisor.failures import ExitInfo, read_error_file
from launcher.view.logs import LogFollower, last_lines
from launcher.nodes.link import NodeLink, NodeWatch
from launcher.supervisor.policy import (
    Action, Close, Ending, GiveUp, Hang, JobView, Kill, RankView, Relaunch, RestartAll,
    ScheduleRelaunch, StartAll, Stop, WaitUntil, decide,
)
from launcher.procs.process import Child, Stopping, Watchdog, become_subreaper, spawn, stop_all, sweep
from launcher.view.progress import EventTail
from launcher.view.render import Row, SummaryRow, View, print_summary
from launcher.nodes.rendezvous import RendezvousStore
from launcher.procs.spare_pool import Spare, SparePool
from launcher.procs.spec import (
    ProcessSpec, Role, error_file, scheduler_spec, script_argv, spare_spec, worker_spec,
)
from launcher.supervisor.state import Failure, Worker, WorkerState
from recovery.control.client import SchedulerControl
from recovery.control.files import Endpoint
from recovery.events import EventLog

__all__ = ["Supervisor", "EXIT_SIGINT", "EXIT_SIGTERM", "EXIT_SUPERVISOR_ERROR"]

logger = logging.getLogger(__name__)

EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM
EXIT_SUPERVISOR_ERROR = 70
"""tftrun's status when its own loop failed (sysexits' EX_SOFTWARE); it stopped every
process in order first."""
SUMMARY_LOG_LINES = 10
VERDICT_INTERVAL = 0.5
"""Seconds between asking the scheduler which workers it declares dead or hung."""
AUTOMATIC_SPARES = 1
"""Spares kept without ``--warm_spare`` once this node's script is seen using recovery."""
SPARE_PROBE_INTERVALS = (1.0, 30.0)
"""Seconds between asking the scheduler whether a worker registered, for that spare: the
first, doubled after every answer up to the second (a plain script never registers)."""
_ALIVE = (WorkerState.RUNNING, WorkerState.STOPPING)


def _first_incarnation(config: LaunchConfig) -> int:
    """The incarnation of each worker's first launch: 0 on one node.

    With many nodes, a node's tftrun may be started again while the job runs (a lost node
    returns). Its workers' incarnations must differ from its predecessor's, which the
    scheduler still holds (a generation is a set of (node id, incarnation)), so they count
    from the launch time in milliseconds, as a worker started by hand does.
    """
    return time.time_ns() // 1_000_000 if config.multi_node else 0


class NodeLost(RuntimeError):
    """Node 0 did not answer within ``--cluster_time_out`` where this node needed it."""


class Supervisor:
    """Runs one node's share of a job to its end and returns tftrun's exit status."""

    def __init__(self, config: LaunchConfig, store_socket: socket.socket | None,
                 view: View, events: EventLog) -> None:
        self.config = config
        self.view = view
        self.events = events
        first = _first_incarnation(config)
        self.workers = [Worker(rank=config.first_rank + i, local_rank=i, incarnation=first - 1)
                        for i in range(config.nproc)]
        self.restart_count = 0
        """Restarts of the whole group (torchrun's ``TORCHELASTIC_RESTART_COUNT``)."""
        self.relaunches = 0
        """Relaunches of single ranks (per-rank recovery)."""
        self._store_socket = store_socket
        self._scheduler: Child | None = None
        self._scheduler_launches = 0
        self._rendezvous = RendezvousStore(config.local_addr)
        self._rendezvous_host = config.local_addr
        self._nodes = (NodeLink(config.master_addr, config.master_port, config.job_token,
                                config.run_id, self._refused_value)
                       if config.multi_node else None)
        """Node 0's cluster store, to agree with the other nodes (only with other nodes)."""
        self._peer_restarts = 0
        self._peer_end = ""
        self._node_watch = NodeWatch(config.node_time_out)
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._follower = LogFollower(view.output) if config.join else None
        # Connected once the workers are started, on one node once something needs it.
        self._control = SchedulerControl(config.master_addr, config.master_port,
                                         config.job_token,
                                         rejoin_cooldown=config.rejoin_cooldown, connect=False,
                                         run_id=config.run_id)
        self._restart_at: float | None = None
        self._rendezvous_port = 0
        self._restart_why = ""
        self._next_verdicts = 0.0
        self._signal: int | None = None
        self._ending: Ending | None = None
        self._closing: Stopping | None = None
        """The spares and the scheduler being stopped, once the workers are."""
        self._closing_spares: list[Spare] = []
        self._closing_scheduler: Child | None = None
        self._registered: set[str] = set()
        """Node ids seen registered with the scheduler: capable of per-rank recovery."""
        self._registrations = (EventTail(self.events.path)
                               if config.hosts_scheduler and self.events.path else None)
        """Where this node's scheduler writes every registration, before it answers it:
        who registered is known without asking the scheduler, which may still be starting."""
        self._spares = SparePool(config.warm_spare or 0, self._start_spare)
        self._watchdog: Watchdog | None = None
        """Kills what this supervisor started once it is gone (started by :meth:`run`)."""
        self._next_spare_probe = 0.0
        self._spare_probe_interval = SPARE_PROBE_INTERVALS[0]

    # ----------------------------------------------------------------- lifecycle
    def run(self) -> int:
        become_subreaper()
        watchdog = self._watchdog = Watchdog()
        with self._signal_handlers() as wakeup:
            self._emit("job_start", run_id=self.config.run_id, pid=os.getpid(),
                       script=str(self.config.script), script_args=list(self.config.script_args),
                       worker_num=self.config.worker_num, local_worker_num=self.config.nproc,
                       node_rank=self.config.node_rank, master_addr=self.config.master_addr,
                       master_port=self.config.master_port, log_dir=str(self.config.log_dir),
                       max_restarts=self.config.max_restarts, is_recover=self.config.is_recover,
                       lineage=self.config.lineage)
            if self._follower is not None:
                self._follower.start()
            remote = self._point_at_remote_scheduler()
            try:
                try:
                    if self._store_socket is not None:
                        self._start_scheduler()
                    self._start_workers()
                    status = self._loop(wakeup)
                except Exception as error:  # noqa: BLE001 - any bug still stops in order
                    status = self._stop_on_error(error)
            finally:
                if self._follower is not None:
                    self._follower.stop()
                self._control.close()
                self._rendezvous.close()
                if remote is not None:
                    remote.remove(self.config.log_dir)
                if self._nodes is not None:
                    self._nodes.close()
                self.view.close()
                watchdog.close()
        return status

    def _point_at_remote_scheduler(self) -> Endpoint | None:
        """On a node without the scheduler: say in the log dir where it serves (on node 0),
        with this tftrun's pid, so that ``tftctl status`` works on this node too."""
        if self.config.hosts_scheduler:
            return None
        endpoint = Endpoint(self.config.master_addr, self.config.master_port, os.getpid(),
                            self.config.run_id, time.time())
        endpoint.write(self.config.log_dir)
        return endpoint

    @contextmanager
    def _signal_handlers(self) -> Iterator[int]:
        """Queue SIGINT/SIGTERM; let SIGCHLD (and both) wake the loop through a pipe."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM,
                                                             signal.SIGCHLD)}
        signal.signal(signal.SIGINT, lambda signum, _frame: self._signals.put(signum))
        signal.signal(signal.SIGTERM, lambda signum, _frame: self._signals.put(signum))
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        try:
            yield read_fd
        finally:
            signal.set_wakeup_fd(previous_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(read_fd)
            os.close(write_fd)

    @staticmethod
    def _wait(wakeup: int, timeout: float) -> None:
        """Sleep until a signal (SIGCHLD included) arrives or ``timeout`` passes."""
        readable, _, _ = select.select([wakeup], [], [], timeout)
        if readable:
            try:
                while os.read(wakeup, 512):
                    pass
            except BlockingIOError:
                pass

    def _loop(self, wakeup: int) -> int:
        """Observe, let the policy decide, carry out its actions; until the job ended."""
        while True:
            now = time.time()
            wait = self.config.monitor_interval
            for action in decide(self._observe(now), now):
                if isinstance(action, WaitUntil):
                    wait = min(wait, max(0.0, action.at - time.time()))
                else:
                    self._carry_out(action, now)
            if self._closing is not None and self._closing.poll():
                self._record_closed()
                return self._finish()
            if self._ending is None:
                self._tend_spares()
            self._refresh()
            self._wait(wakeup, wait)

    # ----------------------------------------------------------------- children
    def _emit(self, event: str, **fields: object) -> None:
        self.view.on_event(self.events.emit(event, **fields))

    def _refused_value(self, key: str, why: str, count: int) -> None:
        """Values of a cluster-store key that are not the job's (launcher/nodes/link.py)."""
        self._emit("store_value_refused", key=key, reason=why, count=count)

    def _header(self, spec: ProcessSpec, incarnation: int) -> str:
        return (f"==== tftrun: {spec.role.value} rank={spec.rank} incarnation={incarnation} "
                f"restart_count={self.restart_count} at {time.strftime('%Y-%m-%d %H:%M:%S')} ====")

    def _spawn(self, spec: ProcessSpec, incarnation: int, pass_fds: tuple[int, ...] = ()) -> Child:
        child = spawn(spec.argv, spec.env, spec.log_path, self._header(spec, incarnation),
                      pass_fds)
        assert self._watchdog is not None
        self._watchdog.watch(child)
        return self._started(spec, child, incarnation)

    def _started(self, spec: ProcessSpec, child: Child, incarnation: int,
                 **fields: object) -> Child:
        """Record that ``child`` now runs as ``spec``: its ``spawn`` event, its log followed."""
        self._emit("spawn", role=spec.role.value, rank=spec.rank, pid=child.pid,
                   incarnation=incarnation, restart_count=self.restart_count, **fields)
        if self._follower is not None:
            label = f"rank {spec.rank}" if spec.role is Role.WORKER else spec.role.value
            self._follower.follow(spec.log_path, label)
        return child

    def _start_scheduler(self) -> None:
        assert self._store_socket is not None
        fd = self._store_socket.fileno()
        self._scheduler = self._spawn(scheduler_spec(self.config, fd), self._scheduler_launches,
                                      pass_fds=(fd,))
        self._scheduler_launches += 1

    def _start_workers(self) -> None:
        if self._meets_at_scheduler():
            self._rendezvous_port = self.config.master_port
        elif self.config.hosts_scheduler:
            self._rendezvous_port = self._rendezvous.open()
        else:
            self._rendezvous_host, self._rendezvous_port = self._meeting_place()
        for worker in self.workers:
            self._launch(worker)
        # After the spawns: importing torch here overlaps with the workers doing the same.
        if self.config.hosts_scheduler and not self._meets_at_scheduler():
            self._rendezvous.serve(self._announce_rendezvous())
        if self._nodes is not None:
            self._control.connect()

    def _meets_at_scheduler(self) -> bool:
        """Whether this launch's ``env://`` workers meet at the scheduler's store.

        The first launch of a job on one node does: that store is new, so it holds no
        earlier attempt's keys (rendezvous.py), and this process imports no torch to
        host one while the workers import theirs (docs/benchmarks.md, launch). A group
        restart meets at a fresh store of its own, as other nodes' workers always do.
        """
        return (self._store_socket is not None and self._nodes is None
                and self.restart_count == 0)

    def _connect_when_needed(self) -> None:
        """On one node, connect to the scheduler only once something needs it: a worker
        registered (verdicts about it may come) or a worker failed (a report to make).
        Until then no question asked of the scheduler has an answer it needs, and each
        verdict poll would be a request the scheduler handles while the workers start.
        With other nodes, the connection is made at launch (:meth:`_start_workers`)."""
        if self._registered or any(w.failure is not None for w in self.workers):
            self._control.connect()

    def _read_registrations(self) -> None:
        """Take the new registrations from this node's events file, until every worker of
        this node is known to have registered (the view reads the same file for itself)."""
        if self._registrations is None or all(str(w.rank) in self._registered
                                              for w in self.workers):
            return
        self._registered |= {str(e["node_id"]) for e in self._registrations.read()
                             if e.get("event") == "register" and "node_id" in e}

    def _announce_rendezvous(self) -> Callable[[], None] | None:
        """Node 0 with other nodes: tell them where this restart's workers meet, once the
        store is served (from its thread, through a link of its own)."""
        if self._nodes is None:
            return None
        publisher = NodeLink(self.config.master_addr, self.config.master_port,
                             self.config.job_token, self.config.run_id)
        return partial(publisher.publish_rendezvous, self.restart_count,
                       self._rendezvous_host, self._rendezvous_port)

    def _meeting_place(self) -> tuple[str, int]:
        """A node other than node 0: where node 0 says this restart's workers meet."""
        assert self._nodes is not None
        where = self._nodes.rendezvous(self.restart_count, self.config.cluster_time_out)
        if where is None:
            raise NodeLost(f"node 0 did not say where the workers of restart "
                           f"{self.restart_count} meet within --cluster_time_out="
                           f"{self.config.cluster_time_out:g}s")
        return where

    def _launch(self, worker: Worker, warm: bool = False) -> None:
        """Start ``worker``'s next incarnation; ``warm``: in an idle spare, if there is one.

        A launch whose process cannot be started (an OSError: no memory, no pids, a log
        that cannot be opened) is a failed launch: the worker is FAILED, and the policy
        decides about it like any failure, with the budget it charges.
        """
        worker.incarnation += 1
        spec = worker_spec(self.config, worker.local_rank, worker.incarnation,
                           self.restart_count, self._rendezvous_port,
                           rendezvous_host=self._rendezvous_host)
        try:
            spare = self._spares.hand_over(spec, script_argv(self.config),
                                           self._header(spec, worker.incarnation)) if warm else None
            if spare is None:
                child = self._spawn(spec, worker.incarnation)
            else:
                child = self._started(spec, spare, worker.incarnation, warm=True)
        except OSError as err:
            worker.launch_failed(Failure.of_spawn(worker.rank, worker.incarnation, time.time(), err))
            self._emit("fault", rank=worker.rank, pid=None, incarnation=worker.incarnation,
                       cause="spawn", error=str(err))
            return
        worker.launched(child)

    def _start_spare(self, go_fd: int, serial: int) -> Child:
        spec = spare_spec(self.config, go_fd, self.restart_count, self._rendezvous_port)
        return self._spawn(spec, serial, pass_fds=(go_fd,))

    def _tend_spares(self) -> None:
        """Keep ``--warm_spare`` spares started; one that died idle is replaced, no fault."""
        self._start_automatic_spare()
        try:
            ended = self._spares.tend()
        except OSError as err:
            # Planned again at the next pass; a missing spare only means a cold start.
            logger.warning("a warm spare could not be started: %s", err)
            return
        self._record_spare_exits(ended, expected=False)

    def _start_automatic_spare(self) -> None:
        """Without ``--warm_spare``: keep :data:`AUTOMATIC_SPARES` from the time a worker
        of this node is seen registered with the scheduler (its script uses recovery, so a
        dead rank is relaunched alone), unless every failure restarts all workers."""
        if (self.config.warm_spare is not None or self._spares.size
                or self.config.restart_policy == "all"):
            return
        now = time.monotonic()
        if now < self._next_spare_probe:
            return
        self._next_spare_probe = now + self._spare_probe_interval
        if not any(str(w.rank) in self._registered for w in self.workers):
            status = self._control.status()
            if status is None:  # no answer: ask again, not backing off
                return
            self._spare_probe_interval = min(2 * self._spare_probe_interval,
                                             SPARE_PROBE_INTERVALS[1])
            self._registered |= {str(m["node_id"]) for m in status["members"]}
        if any(str(w.rank) in self._registered for w in self.workers):
            self._spares.keep(AUTOMATIC_SPARES)

    def _record_spare_exits(self, ended: list[tuple[Spare, int]], expected: bool) -> None:
        for spare, returncode in ended:
            self._exit_info(Role.SPARE, None, spare.child, spare.serial, returncode, expected)

    def _exit_info(self, role: Role, rank: int | None, child: Child, incarnation: int,
                   returncode: int, expected: bool) -> ExitInfo:
        info = ExitInfo(role.value, rank, child.pid, incarnation, returncode, time.time(),
                        expected)
        self._emit("exit", **info.fields())
        return info

    def _tell_scheduler(self, info: ExitInfo) -> None:
        """The scheduler's membership learns of a worker's exit. A store round trip, so it
        comes after the events that date the exit: their times are when the supervisor saw
        it, however long the scheduler takes to answer."""
        assert info.rank is not None
        abnormal = not (info.expected or info.succeeded)
        if not abnormal and self._registrations is not None \
                and str(info.rank) not in self._registered:
            return  # a plain script's worker: the scheduler never knew it
        self._control.report_exit(
            node_id=str(info.rank), rank=info.rank, pid=info.pid, incarnation=info.incarnation,
            abnormal=abnormal, reason=info.describe())

    def _watch_scheduler(self) -> None:
        """Relaunch a dead scheduler at once, on the same (inherited) socket."""
        child = self._scheduler
        if child is None or (returncode := child.poll()) is None:
            return
        info = self._exit_info(Role.SCHEDULER, None, child, self._scheduler_launches - 1,
                               returncode, expected=False)
        if self._scheduler_launches > self.config.max_restarts:
            self._scheduler = None
            logger.error("scheduler %s; its restart budget is spent", info.describe())
            return
        self._emit("restart", what="scheduler", why=f"scheduler {info.describe()}",
                   restart_count=self._scheduler_launches)
        self._start_scheduler()

    def _reap_workers(self) -> None:
        """Record every worker whose process ended; a ``fault`` for each unexpected end."""
        for worker in self.workers:
            if worker.state not in _ALIVE or worker.child is None:
                continue
            returncode = worker.child.poll()
            if returncode is None:
                continue
            info = self._exit_info(Role.WORKER, worker.rank, worker.child, worker.incarnation,
                                   returncode, expected=worker.state is WorkerState.STOPPING)
            worker.ended(info)
            if worker.failure is not None and worker.state is WorkerState.FAILED:
                failure = worker.failure
                self._emit("fault", rank=failure.rank, pid=failure.pid,
                           incarnation=failure.incarnation, cause=failure.cause)
            self._tell_scheduler(info)

    # ----------------------------------------------------------------- policy
    def _observe(self, now: float) -> JobView:
        """What the policy needs to see; the only place the loop asks the outside world."""
        self._take_signal()
        self._watch_scheduler()
        self._read_registrations()  # first: whether an exit reaped now is the scheduler's to know
        self._reap_workers()
        self._connect_when_needed()
        sweep()
        verdicts = self._verdicts(now) if self._ending is None else {}
        if verdicts is not None and self._ending is None:
            self._hear_other_nodes(now)
        undecided = [w for w in self.workers if w.state is WorkerState.FAILED
                     and self._restart_at is None and self._ending is None]
        unknown = self._learn_registrations(undecided)
        ranks = tuple(self._rank_view(w, w in undecided, unknown, now) for w in self.workers)
        peer_restart = (f"another node started group restart {self._peer_restarts}"
                        if self._peer_restarts > self.restart_count else "")
        return JobView(ranks, self.config.max_restarts, self.config.restart_policy,
                       self.restart_count, self.relaunches, self._restart_at, self._ending,
                       self._signal, verdicts or {}, peer_restart, self._peer_end)

    def _rank_view(self, worker: Worker, undecided: bool, unknown: bool,
                   now: float) -> RankView:
        node_id = str(worker.rank)
        registered: bool | None = node_id in self._registered or (None if unknown else False)
        cooldown_until = (now + self._control.cooldown_left(node_id)
                          if undecided and registered else 0.0)
        return RankView(worker.rank, worker.state, worker.deadline, worker.failure, registered,
                        cooldown_until, worker.hung, worker.relaunch_why)

    def _verdicts(self, now: float) -> dict[int, str] | None:
        """The workers the scheduler declares dead (no heartbeat) or hung (no progress),
        asked at most every :data:`VERDICT_INTERVAL`; ``None`` when not asked now."""
        if now < self._next_verdicts:
            return None
        self._next_verdicts = now + VERDICT_INTERVAL
        verdicts = self._control.verdicts()
        return self._about_own_processes(verdicts) if verdicts else verdicts

    def _about_own_processes(self, verdicts: dict[int, str]) -> dict[int, str]:
        """The verdicts about this node's running processes.

        A verdict names a rank; it may be about a process this tftrun never started: one
        of a tftrun of this node that was killed (its workers died with it, unreported),
        whose rank this tftrun now runs again in a new process that has not registered
        yet. Killing that one would be wrong: a verdict counts only for the pid the
        scheduler holds for the rank.
        """
        status = self._control.status()
        if status is None:
            return {}
        held = {m["rank"]: m["pid"] for m in status["members"]}
        return {rank: why for rank, why in verdicts.items()
                if any(w.rank == rank and w.pid == held.get(rank) for w in self.workers)}

    def _hear_other_nodes(self, now: float) -> None:
        """Whether another node started a group restart, ended the job for all, or has
        been gone for longer than ``--node_time_out`` (then this node ends it for all)."""
        if self._nodes is None:
            return
        self._peer_restarts = max(self._peer_restarts, self._nodes.restarts_started() or 0)
        self._peer_end = self._nodes.ended() or ""
        if (lost := self._node_watch.seen(self._gone(), now)) and not self._peer_end:
            self._peer_end = f"node {self.config.node_rank}: {lost}"
            self._nodes.end(self._peer_end)

    def _gone(self) -> str:
        """What of the other nodes is missing just now ('' when nothing is)."""
        if not self.config.hosts_scheduler:
            return "" if self._nodes is None or self._nodes.reachable else "node 0's scheduler"
        status = self._control.status()
        own = {w.rank for w in self.workers}
        missing = [] if status is None else [r for r in status["missing"] if r not in own]
        return f"the ranks {missing} of another node" if missing else ""

    def _learn_registrations(self, failed: list[Worker]) -> bool:
        """Ask the scheduler which node ids registered, when a failed one is not known to.

        A node id that registered once stays capable (every incarnation runs the same
        script). True when the answer is still unknown: on a node without the scheduler,
        it runs but did not answer (the policy then waits up to ``STATUS_WAIT`` rather
        than taking no answer for "nobody registered" and restarting every worker). On
        the scheduler's node its events file answers (:meth:`_read_registrations`).
        """
        if all(str(w.rank) in self._registered for w in failed):
            return False
        status = self._control.status()
        if status is not None:
            self._registered |= {str(m["node_id"]) for m in status["members"]}
            return False
        if self._registrations is not None:
            return False  # this node's events file has every registration (read just now)
        return self._scheduler is not None and self._scheduler.poll() is None

    def _take_signal(self) -> None:
        try:
            signum = self._signals.get_nowait()
        except queue.Empty:
            return
        if self._signal is None:
            self._signal = signum

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
                self.relaunches += 1
                self._emit("restart", what="rank", why=worker.relaunch_why,
                           restart_count=self.restart_count + self.relaunches, ranks=[rank])
                self._launch(worker, warm=True)
            case RestartAll(at, why):
                self._restart_at, self._restart_why = at, why
                if self._nodes is not None:
                    self._nodes.restart_all(max(self.restart_count + 1, self._peer_restarts))
                self._stop_workers(now)
            case StartAll():
                self._restart_all()
            case Stop(status, reason):
                self._end(Ending(status, reason), now)
            case GiveUp(failure, reason):
                if self._nodes is not None:
                    self._nodes.end(f"node {self.config.node_rank}: {reason}")
                self._end(Ending(failure.exit_status, reason, failure), now)
            case Kill(rank):
                child = self._worker(rank).child
                assert child is not None
                child.signal_group(signal.SIGKILL)
            case Close():
                self._close()

    def _worker(self, rank: int) -> Worker:
        return next(w for w in self.workers if w.rank == rank)

    def _stop_workers(self, now: float) -> None:
        """SIGTERM every running worker (STOPPING until its grace period ends, then the
        policy SIGKILLs it); withdraw every relaunch waiting in COOLDOWN."""
        for worker in self.workers:
            if worker.state is WorkerState.RUNNING and worker.child is not None:
                worker.transition(WorkerState.STOPPING, deadline=now + self.config.grace_period)
                worker.child.signal_group(signal.SIGTERM)
            elif worker.state is WorkerState.COOLDOWN:
                worker.transition(WorkerState.STOPPED)

    def _restart_all(self) -> None:
        self._restart_at = None
        # With other nodes, every node's workers of one restart carry its number.
        self.restart_count = max(self.restart_count + 1, self._peer_restarts)
        self._emit("restart", what="workers", why=self._restart_why,
                   restart_count=self.restart_count, ranks=[w.rank for w in self.workers])
        self._start_workers()

    def _end(self, ending: Ending, now: float) -> None:
        """The job ends: stop the workers; the spares and the scheduler follow (Close)."""
        self._ending, self._restart_at = ending, None
        self._stop_workers(now)

    def _close(self) -> None:
        """Stop the idle spares and the scheduler, once no worker is left to need it."""
        if self._closing is not None:
            return
        self._closing_spares = self._spares.retire_all()
        self._closing_scheduler, self._scheduler = self._scheduler, None
        children = [s.child for s in self._closing_spares]
        if self._closing_scheduler is not None:
            children.append(self._closing_scheduler)
        self._closing = Stopping(children, signal.SIGTERM, self.config.grace_period)

    def _record_closed(self) -> None:
        """Record the exits of the spares and the scheduler that were stopped."""
        self._record_spare_exits([(s, s.child.popen.returncode) for s in self._closing_spares],
                                 expected=True)
        self._closing_spares = []
        child, self._closing_scheduler = self._closing_scheduler, None
        if child is not None:
            self._exit_info(Role.SCHEDULER, None, child, self._scheduler_launches - 1,
                            child.popen.returncode, expected=True)

    def _stop_on_error(self, error: Exception) -> int:
        """The loop raised: stop every process in order anyway, then end the job.

        SIGTERM, grace period, SIGKILL, as on any stop, so that the workers get their
        chance to save last words: the workers and the spares first, then the scheduler
        (which the workers' last words need). ``job_end`` says why. The traceback goes to
        tftrun's log for the bug report; tftrun exits with :data:`EXIT_SUPERVISOR_ERROR`.
        """
        logger.error("internal error; stopping every process in order", exc_info=error)
        failing = self._ending.failing if self._ending is not None else None
        self._ending = Ending(EXIT_SUPERVISOR_ERROR,
                              f"supervisor error: {type(error).__name__}: {error}", failing)
        with suppress(Exception):
            self._stop_everything_now()
        return self._finish()

    def _stop_everything_now(self) -> None:
        """The blocking stop of the error path: workers and spares, then the scheduler."""
        running = [w for w in self.workers if w.child is not None and w.child.poll() is None]
        self._closing_spares += self._spares.retire_all()
        stop_all([*(w.child for w in running if w.child),
                  *(s.child for s in self._closing_spares)],
                 signal.SIGTERM, self.config.grace_period)
        for worker in running:
            assert worker.child is not None
            worker.last_exit = self._exit_info(Role.WORKER, worker.rank, worker.child,
                                               worker.incarnation, worker.child.popen.returncode,
                                               expected=True)
            self._tell_scheduler(worker.last_exit)
        if self._scheduler is not None:
            self._closing_scheduler, self._scheduler = self._scheduler, None
        if self._closing_scheduler is not None:
            stop_all([self._closing_scheduler], signal.SIGTERM, self.config.grace_period)
        self._record_closed()

    def _finish(self) -> int:
        """Emit ``job_end`` and print the summary; tftrun's exit status."""
        ending = self._ending
        assert ending is not None
        self._emit("job_end", exitcode=ending.status, reason=ending.reason,
                   restarts=self.restart_count, relaunches=self.relaunches)
        self._refresh()
        self.view.close()
        rows = [SummaryRow(w.rank, w.pid, w.last_exit.describe() if w.last_exit else w.state.value,
                           w.restarts) for w in self.workers]
        failing = ending.failing
        if failing is None:
            print_summary(rows, None, [], None)
        else:
            log = self.config.log_dir / f"worker_{failing.rank}.log"
            root_cause = read_error_file(error_file(self.config, failing.rank))
            print_summary(rows, f"rank {failing.rank} (pid {failing.pid}) {failing.reason}",
                          last_lines(log, SUMMARY_LOG_LINES), root_cause)
        return ending.status

    def _refresh(self) -> None:
        if not self.view.wants_rows:
            return
        self.view.show_rows([
            Row(w.rank, w.pid, self._state_text(w), w.restarts,
                (last_lines(self.config.log_dir / f"worker_{w.rank}.log", 1) or [""])[0])
            for w in self.workers], caption=self._spares.describe())

    def _state_text(self, worker: Worker) -> str:
        """The live view's state; a relaunch or a group restart counts its wait down."""
        due = worker.deadline if worker.state is WorkerState.COOLDOWN else (
            self._restart_at if worker.state is not WorkerState.STOPPING else None)
        if due is not None:
            return f"cooldown {max(0.0, due - time.time()):.0f}s"
        return worker.state.value
