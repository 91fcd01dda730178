"""The per-node supervisor: start the scheduler and the workers, watch them, restart, stop.

One loop, woken by SIGCHLD (so a death is seen at once, not at the next poll) or every
``monitor_interval``: drain the signal queue, reap and classify exits, apply the failure
policy, redraw the view. Signal handlers only queue the signal number.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from launcher.config import LaunchConfig
from launcher.failures import ExitInfo, read_error_file
from launcher.logs import LogFollower, last_lines
from launcher.process import Child, spawn, stop_all
from launcher.render import Row, SummaryRow, View, print_summary
from launcher.rendezvous import RendezvousStore
from launcher.spares import Spare, SparePool
from launcher.spec import (
    ProcessSpec, Role, error_file, scheduler_spec, script_argv, spare_spec, worker_spec,
)
from launcher.state import Worker, WorkerState
from recovery.control import SchedulerControl
from recovery.events import EventLog

__all__ = ["Supervisor", "EXIT_SIGINT", "EXIT_SIGTERM"]

logger = logging.getLogger(__name__)

EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM
SUMMARY_LOG_LINES = 10
VERDICT_INTERVAL = 0.5
"""Seconds between asking the scheduler which workers it declares dead or hung."""
_STATUS_WAIT = 10.0
_STATUS_RETRY_PAUSE = 0.1


class _Stop(Exception):
    """Raised inside the loop when a SIGINT/SIGTERM asks the job to stop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Supervisor:
    """Runs one node's share of a job to its end and returns tftrun's exit status."""

    def __init__(self, config: LaunchConfig, store_socket: socket.socket | None,
                 view: View, events: EventLog) -> None:
        self.config = config
        self.view = view
        self.events = events
        self.workers = [Worker(rank=config.first_rank + i, local_rank=i)
                        for i in range(config.nproc)]
        self.restart_count = 0
        """Restarts of the whole group (torchrun's ``TORCHELASTIC_RESTART_COUNT``)."""
        self.relaunches = 0
        """Relaunches of single ranks (per-rank recovery)."""
        self._store_socket = store_socket
        self._scheduler: Child | None = None
        self._scheduler_launches = 0
        self._rendezvous = RendezvousStore(config.master_addr)
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._follower = LogFollower(view.output) if config.join else None
        self._control = SchedulerControl(config.master_addr, config.master_port,
                                         config.job_token,
                                         rejoin_cooldown=config.rejoin_cooldown)
        self._restart_at: float | None = None
        self._rendezvous_port = 0
        self._restart_why = ""
        self._next_verdicts = 0.0
        self._hung: set[int] = set()
        self._registered: set[str] = set()
        """Node ids seen registered with the scheduler: capable of per-rank recovery."""
        self._spares = SparePool(config.warm_spare, self._start_spare)

    # ----------------------------------------------------------------- lifecycle
    def run(self) -> int:
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
            try:
                if self._store_socket is not None:
                    self._start_scheduler()
                self._start_workers()
                status = self._loop(wakeup)
            except _Stop as stop:
                status = 128 + stop.signum
                self._shutdown(signal.SIGTERM)
                self._finish(status, f"received {stop}")
            finally:
                if self._follower is not None:
                    self._follower.stop()
                self._control.close()
                self._rendezvous.close()
                self.view.close()
        return status

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

    def _wait(self, wakeup: int, timeout: float) -> None:
        """Sleep until a signal arrives or ``timeout`` passes; then act on queued signals."""
        readable, _, _ = select.select([wakeup], [], [], timeout)
        if readable:
            try:
                while os.read(wakeup, 512):
                    pass
            except BlockingIOError:
                pass
        self._check_signals()

    def _check_signals(self) -> None:
        try:
            signum = self._signals.get_nowait()
        except queue.Empty:
            return
        raise _Stop(signum)

    def _loop(self, wakeup: int) -> int:
        while True:
            self._wait(wakeup, self.config.monitor_interval)
            self._watch_scheduler()
            self._kill_declared_dead()
            failed = self._reap_workers()
            if failed:
                if self.restart_count + self.relaunches >= self.config.max_restarts:
                    return self._give_up(failed[0])
                self._handle_failures(failed)
            self._launch_due()
            self._tend_spares()
            if all(w.state is WorkerState.SUCCEEDED for w in self.workers):
                self._shutdown(signal.SIGTERM)
                return self._finish(0, "all workers succeeded")
            self._refresh()

    # ----------------------------------------------------------------- children
    def _emit(self, event: str, **fields: object) -> None:
        self.view.on_event(self.events.emit(event, **fields))

    def _header(self, spec: ProcessSpec, incarnation: int) -> str:
        return (f"==== tftrun: {spec.role.value} rank={spec.rank} incarnation={incarnation} "
                f"restart_count={self.restart_count} at {time.strftime('%Y-%m-%d %H:%M:%S')} ====")

    def _spawn(self, spec: ProcessSpec, incarnation: int, pass_fds: tuple[int, ...] = ()) -> Child:
        child = spawn(spec.argv, spec.env, spec.log_path, self._header(spec, incarnation),
                      pass_fds)
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
        self._rendezvous_port = self._rendezvous.open()
        for worker in self.workers:
            self._launch(worker)
        # After the spawns: importing torch here overlaps with the workers doing the same.
        self._rendezvous.serve()

    def _launch(self, worker: Worker, warm: bool = False) -> None:
        """Start ``worker``'s next incarnation; ``warm``: in an idle spare, if there is one."""
        worker.incarnation += 1
        spec = worker_spec(self.config, worker.local_rank, worker.incarnation,
                           self.restart_count, self._rendezvous_port)
        spare = self._spares.hand_over(spec, script_argv(self.config),
                                       self._header(spec, worker.incarnation)) if warm else None
        if spare is None:
            worker.child = self._spawn(spec, worker.incarnation)
        else:
            worker.child = self._started(spec, spare, worker.incarnation, warm=True)
        worker.launches += 1
        worker.transition(WorkerState.RUNNING)

    def _start_spare(self, go_fd: int, serial: int) -> Child:
        spec = spare_spec(self.config, go_fd, self.restart_count, self._rendezvous_port)
        return self._spawn(spec, serial, pass_fds=(go_fd,))

    def _tend_spares(self) -> None:
        """Keep ``--warm_spare`` spares started; one that died idle is replaced, no fault."""
        self._record_spare_exits(self._spares.tend(), expected=False)

    def _record_spare_exits(self, ended: list[tuple[Spare, int]], expected: bool) -> None:
        for spare, returncode in ended:
            self._exit_info(Role.SPARE, None, spare.child, spare.serial, returncode, expected)

    def _exit_info(self, role: Role, rank: int | None, child: Child, incarnation: int,
                   returncode: int, expected: bool) -> ExitInfo:
        info = ExitInfo(role.value, rank, child.pid, incarnation, returncode, time.time(),
                        expected)
        self._emit("exit", **info.fields())
        if rank is not None:
            self._control.report_exit(
                node_id=str(rank), rank=rank, pid=child.pid, incarnation=incarnation,
                abnormal=not (expected or info.succeeded), reason=info.describe())
        return info

    def _kill_declared_dead(self) -> None:
        """Kill the workers the scheduler declares dead (no heartbeat) or hung (no progress).

        Their exit is then seen like any other death. SIGKILL, because a hung or stopped
        process may never act on a gentler signal.
        """
        now = time.monotonic()
        if now < self._next_verdicts:
            return
        self._next_verdicts = now + VERDICT_INTERVAL
        running = {w.rank: w for w in self.workers if w.state is WorkerState.RUNNING}
        for rank, reason in self._control.verdicts().items():
            worker = running.get(rank)
            if worker is None or worker.child is None:
                continue
            self._emit("hang", rank=rank, pid=worker.pid, incarnation=worker.incarnation,
                       reason=reason)
            self._hung.add(rank)
            worker.child.signal_group(signal.SIGKILL)

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

    def _reap_workers(self) -> list[ExitInfo]:
        """Record every worker that ended; return the failures, earliest first."""
        failed = []
        for worker in self.workers:
            if worker.state is not WorkerState.RUNNING or worker.child is None:
                continue
            returncode = worker.child.poll()
            if returncode is None:
                continue
            info = self._exit_info(Role.WORKER, worker.rank, worker.child, worker.incarnation,
                                   returncode, expected=False)
            worker.last_exit = info
            if info.succeeded:
                worker.transition(WorkerState.SUCCEEDED)
            else:
                worker.transition(WorkerState.FAILED)
                failed.append(info)
        return failed

    def _stop_workers(self, sig: int) -> None:
        """Stop every running worker (signal, grace period, SIGKILL) and record the exits."""
        running = [w for w in self.workers if w.state is WorkerState.RUNNING and w.child]
        for worker in running:
            worker.transition(WorkerState.STOPPING)
        stop_all([w.child for w in running if w.child], sig, self.config.grace_period)
        for worker in running:
            assert worker.child is not None
            returncode = worker.child.poll()
            assert returncode is not None
            worker.last_exit = self._exit_info(Role.WORKER, worker.rank, worker.child,
                                               worker.incarnation, returncode, expected=True)
            worker.transition(WorkerState.STOPPED)

    def _shutdown(self, sig: int) -> None:
        """Stop the workers and the spares, then the scheduler."""
        self._stop_workers(sig)
        self._record_spare_exits(self._spares.stop(sig, self.config.grace_period), expected=True)
        child, self._scheduler = self._scheduler, None
        if child is not None:
            stop_all([child], signal.SIGTERM, self.config.grace_period)
            returncode = child.poll()
            assert returncode is not None
            self._exit_info(Role.SCHEDULER, None, child, self._scheduler_launches - 1,
                            returncode, expected=True)

    # ----------------------------------------------------------------- policy
    def _handle_failures(self, failed: list[ExitInfo]) -> None:
        """Emit a ``fault`` per dead worker and choose: relaunch those ranks, or restart all.

        Per-rank relaunch needs workers that recover by themselves (the ``recovery``
        library); with ``--restart_policy=auto`` a worker that registered with the
        scheduler is taken to be one. The others get torchrun's restart-all.

        Whatever the policy, a rank is not relaunched alone once another rank has
        finished: it would wait for a generation that can never form (the finished
        rank's process is gone) until ``--cluster_time_out``. As torchrun does with a
        group in which one worker failed, the whole group is restarted instead, and
        resumes from its checkpoints (docs/recovery.md).
        """
        registered = self._registered_nodes(failed)
        for failure in failed:
            cause = "hang" if failure.rank in self._hung else (
                failure.signal_name or f"exit code {failure.returncode}")
            self._hung.discard(failure.rank)  # type: ignore[arg-type]
            self._emit("fault", rank=failure.rank, pid=failure.pid,
                       incarnation=failure.incarnation, cause=cause)
        policy = self.config.restart_policy
        per_rank = policy == "rank" or (
            policy == "auto" and all(str(f.rank) in registered for f in failed))
        finished = [w.rank for w in self.workers if w.state is WorkerState.SUCCEEDED]
        if per_rank and not finished:
            self._schedule_relaunches(failed)
            return
        why = "; ".join(f"rank {f.rank} {f.describe()}" for f in failed)
        if per_rank:
            why += f" after ranks {finished} finished: a relaunched rank could not rejoin them"
        self._schedule_restart_all(failed, registered, why)

    def _registered_nodes(self, failed: list[ExitInfo]) -> set[str]:
        """The node ids that registered with the scheduler, the ``failed`` ones included
        if they did.

        A node id that registered once stays capable (every incarnation runs the same
        script). A scheduler slowed down by a loaded host may not answer at once: while
        its process runs it is asked again, up to :data:`_STATUS_WAIT` seconds, rather
        than taking no answer for "nobody registered" and restarting every worker.
        """
        deadline = time.monotonic() + _STATUS_WAIT
        while not {str(f.rank) for f in failed} <= self._registered:
            status = self._control.status()
            if status is not None:
                self._registered |= {str(m["node_id"]) for m in status["members"]}
                break
            if self._scheduler is None or self._scheduler.poll() is not None \
                    or time.monotonic() > deadline:
                break
            time.sleep(_STATUS_RETRY_PAUSE)
        return self._registered

    def _cooldown(self, failed: list[ExitInfo], registered: set[str]) -> float:
        """Seconds to wait before the dead workers' node ids may register again.

        Only a node id that registered has a registration to refuse: a plain torchrun
        script restarts at once, as under torchrun.
        """
        return max((self._control.cooldown_left(str(f.rank)) for f in failed
                    if str(f.rank) in registered), default=0.0)

    def _schedule_relaunches(self, failed: list[ExitInfo]) -> None:
        """Per-rank recovery: the survivors keep running; each dead rank waits its cooldown."""
        for failure in failed:
            worker = next(w for w in self.workers if w.rank == failure.rank)
            worker.transition(WorkerState.COOLDOWN)
            worker.cooldown_until = time.time() + self._cooldown([failure], {str(failure.rank)})
            worker.relaunch_why = f"rank {failure.rank} {failure.describe()}"

    def _launch_due(self) -> None:
        """Start what waited out its cooldown: the whole group, or single ranks."""
        now = time.time()
        if self._restart_at is not None:
            if now >= self._restart_at:
                self._restart_all()
            return
        for worker in self.workers:
            if worker.state is WorkerState.COOLDOWN and now >= worker.cooldown_until:
                self.relaunches += 1
                self._emit("restart", what="rank", why=worker.relaunch_why,
                           restart_count=self.restart_count + self.relaunches,
                           ranks=[worker.rank])
                self._launch(worker, warm=True)

    def _schedule_restart_all(self, failed: list[ExitInfo], registered: set[str],
                              why: str) -> None:
        """torchrun's policy: restart everyone (scripts that do not use ``recovery``, or a
        rank that died after another finished).

        Every other worker is stopped now; the restart waits out the re-registration
        cooldown of the dead workers' node ids, which the scheduler keeps, while the loop
        goes on watching (and the live view counts it down).
        """
        self._stop_workers(signal.SIGTERM)
        self._restart_at = time.time() + self._cooldown(failed, registered)
        self._restart_why = why
        for worker in self.workers:
            worker.transition(WorkerState.COOLDOWN)
            worker.cooldown_until = self._restart_at

    def _restart_all(self) -> None:
        self._restart_at = None
        self.restart_count += 1
        self._emit("restart", what="workers", why=self._restart_why,
                   restart_count=self.restart_count, ranks=[w.rank for w in self.workers])
        self._start_workers()

    def _give_up(self, failure: ExitInfo) -> int:
        """The budget is spent: stop everything and exit with the failing rank's status."""
        self._shutdown(signal.SIGTERM)
        return self._finish(
            failure.exit_status,
            f"rank {failure.rank} {failure.describe()}; restart budget "
            f"({self.config.max_restarts}) spent",
            failing=failure)

    def _finish(self, status: int, reason: str, failing: ExitInfo | None = None) -> int:
        self._emit("job_end", exitcode=status, reason=reason, restarts=self.restart_count,
                   relaunches=self.relaunches)
        self._refresh()
        self.view.close()
        rows = [SummaryRow(w.rank, w.pid, w.last_exit.describe() if w.last_exit else w.state.value,
                           w.restarts) for w in self.workers]
        if failing is None:
            print_summary(rows, None, [], None)
        else:
            log = self.config.log_dir / f"worker_{failing.rank}.log"
            root_cause = read_error_file(error_file(self.config, failing.rank or 0))
            print_summary(rows, f"rank {failing.rank} (pid {failing.pid}) {failing.describe()}",
                          last_lines(log, SUMMARY_LOG_LINES), root_cause)
        return status

    def _refresh(self) -> None:
        if not self.view.wants_rows:
            return
        self.view.show_rows([
            Row(w.rank, w.pid, self._state_text(w), w.restarts,
                (last_lines(self.config.log_dir / f"worker_{w.rank}.log", 1) or [""])[0])
            for w in self.workers])

    @staticmethod
    def _state_text(worker: Worker) -> str:
        if worker.state is WorkerState.COOLDOWN:
            return f"cooldown {max(0.0, worker.cooldown_until - time.time()):.0f}s"
        return worker.state.value
