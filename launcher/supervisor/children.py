"""Starting this node's processes and recording their ends (``spawn`` and ``exit`` events): the
supervisor's hands. Nothing here decides: the loop says what to start (launcher/supervisor/loop.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from socket import socket

from launcher.config import LaunchConfig
from launcher.procs.cores import node_cores, pin, share_of
from launcher.procs.fork_server import ForkServer
from launcher.procs.process import Child, Watchdog, spawn
from launcher.procs.spec import (
    SCHEDULER_MODULE,
    ProcessSpec,
    Role,
    Seat,
    fork_server_spec,
    forks_workers,
    prepare_error_file,
    scheduler_spec,
    script_argv,
    worker_spec,
)
from launcher.supervisor.failures import ExitInfo
from launcher.supervisor.state import Failure, Worker, WorkerState
from launcher.view.logs import LogFollower
from recovery import env as names

__all__ = ["Children", "node_workers"]
LOG_HEADER = "==== tftrun: "
"""How the line tftrun writes to a log before each launch begins (:meth:`Children.header`)."""

_ALIVE = (WorkerState.RUNNING, WorkerState.STOPPING)


def node_workers(config: LaunchConfig) -> list[Worker]:
    """This node's workers, before their first launch; with many nodes, incarnations count from
    the launch time in ms, so that a tftrun started again does not reuse the incarnations the
    scheduler still holds."""
    first = time.time_ns() // 1_000_000 if config.multi_node else 0
    return [Worker(rank=config.first_rank + i, local_rank=i, incarnation=first - 1)
            for i in range(config.nproc)]


class Children:
    """Starts workers and the scheduler as this launch (``restart_count``, the
    rendezvous) wants them, and records every start and end as events."""

    def __init__(self, config: LaunchConfig, emit: Callable[..., None],
                 follower: LogFollower | None, store_socket: socket | None) -> None:
        self.config = config
        self._emit = emit
        self._follower = follower
        self._store_socket = store_socket
        self.watchdog: Watchdog | None = None
        """Kills what this supervisor started once it is gone (set by the supervisor's run)."""
        self.restart_count = 0
        """Restarts of the whole group (torchrun's ``TORCHELASTIC_RESTART_COUNT``)."""
        self.rendezvous: tuple[str, int] = (config.local_addr, 0)
        """Where this restart's ``env://`` workers meet."""
        self.seat: Seat | None = None
        """This generation's ranks, for an elastic node range (None: the fixed ones)."""
        self.scheduler: Child | None = None
        self.scheduler_launches = 0
        self.beat_socket: str | None = None
        """The node's beat socket (launcher/supervisor/beats.py), named to its workers."""
        self.fork_server: ForkServer | None = None
        """Forks the workers warm (launcher/procs/fork_server.py), once started."""
        self._cores = node_cores() if config.bind_core else ()
        """The cores ``--bind_core`` shares out among this node's workers."""

    @property
    def hosts_scheduler(self) -> bool:
        """This node starts the scheduler (tftrun bound its socket)."""
        return self._store_socket is not None

    def header(self, spec: ProcessSpec, incarnation: int) -> str:
        return (f"{LOG_HEADER}{spec.role.value} rank={spec.rank} incarnation={incarnation} "
                f"restart_count={self.restart_count} at {time.strftime('%Y-%m-%d %H:%M:%S')} ====")

    def _watched(self, child: Child) -> Child:
        """``child``, told to the watchdog: its session is killed once this supervisor is gone."""
        assert self.watchdog is not None
        self.watchdog.watch(child)
        return child

    def _spawn(self, spec: ProcessSpec, incarnation: int, pass_fds: tuple[int, ...] = ()) -> Child:
        """``spec``'s process started cold."""
        return self._watched(spawn(spec.argv, spec.env, spec.log_path, self.header(spec, incarnation), pass_fds))

    def _start(self, spec: ProcessSpec, incarnation: int, fds: dict[str, int] | None = None) -> Child:
        """``spec``'s process, forked by the fork server if there is one, else started cold (``fds``: open files
        it gets, by the environment variables that name them); recorded: its ``spawn`` event, its log followed."""
        child = self._fork(spec, incarnation, fds)
        fields = {} if child is None else {"forked": True}
        if child is None:
            child = self._spawn(spec, incarnation, tuple((fds or {}).values()))
        self._emit("spawn", role=spec.role.value, rank=spec.rank, pid=child.pid,
                   incarnation=incarnation, restart_count=self.restart_count, **fields)
        if self._follower is not None and self.config.shows_output(spec.rank):
            label = f"rank {spec.rank}" if spec.role is Role.WORKER else spec.role.value
            self._follower.follow(spec.log_path, label, after=LOG_HEADER)
        return child

    def start_fork_server(self) -> None:
        """Start the fork server, when this node's workers are to be forked: it warms up
        while the scheduler starts, and the first launch waits for it."""
        if forks_workers(self.config):
            self.fork_server = ForkServer(
                lambda sock_fd: self._spawn(fork_server_spec(self.config, sock_fd, os.getpid()), 0, (sock_fd,)))

    def stop_fork_server(self) -> Child | None:
        """Close the fork server's socket (it ends); its Child, to be reaped, if any."""
        server, self.fork_server = self.fork_server, None
        return None if server is None else server.close()

    def start_scheduler(self) -> None:
        """Start the scheduler on the inherited socket (a relaunched one gets the same
        port): forked by the fork server when there is one, which passes it the socket."""
        assert self._store_socket is not None
        fd = self._store_socket.fileno()
        self.scheduler = self._start(scheduler_spec(self.config, fd), self.scheduler_launches,
                                     {names.TFT_STORE_FD: fd})
        self.scheduler_launches += 1

    def launch(self, worker: Worker) -> None:
        """Start ``worker``'s next incarnation, forked by the fork server if there is one; an
        OSError leaves the worker FAILED, for the policy to decide about like any failure."""
        worker.incarnation += 1
        host, port = self.rendezvous
        spec = worker_spec(self.config, worker.local_rank, worker.incarnation,
                           self.restart_count, port, rendezvous_host=host, seat=self.seat,
                           beat_socket=self.beat_socket)
        try:
            prepare_error_file(self.config, worker.rank)
            child = self._start(spec, worker.incarnation)
        except OSError as err:
            worker.launch_failed(Failure.of_spawn(worker.rank, worker.incarnation,
                                                  time.monotonic(), err))
            self._emit("fault", rank=worker.rank, pid=None, incarnation=worker.incarnation,
                       cause="spawn", error=str(err))
            return
        if self._cores:
            pin(child.pid, share_of(self._cores, self.config.nproc, worker.local_rank))
        worker.launched(child)

    def _fork(self, spec: ProcessSpec, incarnation: int,
              fds: dict[str, int] | None = None) -> Child | None:
        """``spec``'s process forked by the fork server (``fds``: open files it gets, by
        the environment variables that name them); None without one."""
        if self.fork_server is None or not self.fork_server.ready():
            return None
        if spec.role is Role.SCHEDULER:  # tftrun's own module, as OWN_PYTHON runs it
            message = {"argv": [SCHEDULER_MODULE], "module": True, "safe_path": True}
        else:
            message = {"argv": list(script_argv(self.config)),
                       "module": self.config.entry == "module"}
        message["title"] = " ".join(spec.argv)
        child = self.fork_server.fork(spec, message, self.header(spec, incarnation), fds)
        return None if child is None else self._watched(child)

    def exit_info(self, role: Role, rank: int | None, child: Child, incarnation: int,
                  returncode: int, expected: bool) -> ExitInfo:
        """How ``child`` ended, recorded as its ``exit`` event."""
        info = ExitInfo(role.value, rank, child.pid, incarnation, returncode, time.monotonic(),
                        expected)
        self._emit("exit", **info.fields())
        return info

    def reap_workers(self, workers: list[Worker]) -> list[ExitInfo]:
        """Record every worker whose process ended (its ``exit``, and a ``fault`` for an
        unexpected end); how each ended."""
        ended = []
        for worker in workers:
            if worker.state not in _ALIVE or worker.child is None:
                continue
            returncode = worker.child.poll()
            if returncode is None:
                continue
            info = self.exit_info(Role.WORKER, worker.rank, worker.child, worker.incarnation,
                                  returncode, expected=worker.state is WorkerState.STOPPING)
            worker.ended(info)
            if worker.failure is not None and worker.state is WorkerState.FAILED:
                failure = worker.failure
                self._emit("fault", rank=failure.rank, pid=failure.pid,
                           incarnation=failure.incarnation, cause=failure.cause)
            ended.append(info)
        return ended

    def reap_scheduler(self) -> str:
        """How the scheduler ended, when it did ('' while it runs or was stopped)."""
        child = self.scheduler
        if child is None or (returncode := child.poll()) is None:
            return ""
        self.scheduler = None
        info = self.exit_info(Role.SCHEDULER, None, child, self.scheduler_launches - 1,
                              returncode, expected=False)
        return info.describe()
