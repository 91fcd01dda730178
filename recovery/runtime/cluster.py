"""``recovery.init()``: join the cluster (or be its scheduler) and get a process group.

A worker joins each generation's group under a fresh store prefix (docs/architecture.md).
Without ``MS_SCHED_PORT`` it falls back to ``env://`` or, run alone, a group of one, so that
the script's collectives still work.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from recovery import env as names
from recovery.control.beat_channel import LocalLink
from recovery.control.inject import Injection
from recovery.control.members import Identity
from recovery.control.rpc import Op, SchedulerLink, SchedulerUnavailable, generation_prefix
from recovery.control.signing import MissingToken, checked_token
from recovery.control.stragglers import StragglerSettings
from recovery.env import WorkerEnv
from recovery.quick_exit import exit_now
from recovery.runtime import folders, group
from recovery.runtime.abort import Aborted, ShouldAbort, never
from recovery.runtime.generation_wait import REPLY_TIMEOUT, ClusterError, wait_for_generation
from recovery.runtime.heartbeat import Heartbeat, news_look_interval
from recovery.runtime.peer_failure import report_peer_failure
from recovery.runtime.registration import RegistrationRefused, register
from recovery.timeouts import Timeouts

__all__ = ["init", "join", "joined", "ClusterContext", "ClusterError", "RegistrationRefused", "FormGroup"]

logger = logging.getLogger(__name__)

_LEAVE_WAIT = 2.0
_REJOIN_POLL = 0.1
_RETIRED_GROUP_WAIT = 5.0
FormGroup = Callable[[Any, int, int], bool]
"""(the generation's store, this rank's place in the group, the group's size) -> formed;
False when a member died meanwhile."""
_joined: ClusterContext | None = None
"""What :func:`init` returned in this process (:func:`joined`)."""


@dataclass
class _Session:
    """A worker's live connection to the scheduler."""

    link: SchedulerLink
    heartbeat: Heartbeat
    timeouts: Timeouts
    group_timeout: timedelta | None


class ClusterContext:
    """What ``init()`` returns: this worker's place in the cluster.

    Attributes:
        rank: this worker's rank (kept across relaunches of its node id).
        world_size: ``worker_num``.
        generation: the generation whose process group this worker is in.
        incarnation: unique per launch of a process.
        active: the ranks of :attr:`generation`'s group, ascending; fewer than
            ``world_size`` in a degraded generation (docs/elastic.md).
    """

    def __init__(self, rank: int, world_size: int, generation: int, node_id: str,
                 incarnation: int, backend: str, session: _Session | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.generation = generation
        self.node_id = node_id
        self.incarnation = incarnation
        self.backend = backend
        self._session = session
        self.active: tuple[int, ...] = tuple(range(world_size))
        self._join_pending = False
        self._failed = False
        self.stop_status: int | None = None
        """128 + N when a stop signal N ends this process (set by the trainer)."""

    @property
    def group_rank(self) -> int:
        """This rank's rank in the process group of its generation."""
        return self.active.index(self.rank)

    @property
    def degraded(self) -> bool:
        """Whether the generation trains without some of the job's ranks."""
        return len(self.active) < self.world_size

    def report_step(self, global_step: int) -> None:
        """Tell the scheduler (with the next heartbeat) that training reached ``global_step``."""
        if self._session is not None:
            self._session.heartbeat.global_step = global_step

    def report_step_time(self, seconds: float) -> None:
        """Tell the scheduler (with the next heartbeat) that a step computed for ``seconds``
        outside its collectives, per micro-batch, since the ranks of a degraded step compute
        different shares (recovery/control/stragglers.py)."""
        if self._session is not None:
            self._session.heartbeat.report_step_time(seconds)

    def report_phase(self, phase: str) -> None:
        """Tell the scheduler (with the next heartbeat) what the loop is doing, e.g.
        ``computing``, ``updating``, ``done``; shown by ``tftctl status``."""
        if self._session is not None:
            self._session.heartbeat.phase = phase

    def pending_injection(self, global_step: int) -> Injection | None:
        """The oldest fault injection for this rank due at ``global_step``, handed out once;
        None when none is. Ask before reporting the step, so that a ``hang`` leaves this rank
        behind the others' step, where the progress rule sees it (docs/fault-injection.md)."""
        if self._session is None:
            return None
        return self._session.heartbeat.inbox.take_due(global_step)

    def claim_last_words(self, global_step: int, consistent: bool, reason: str = "") -> bool:
        """Ask the scheduler whether this rank saves the last-words checkpoint of the fault
        that broke generation :attr:`generation` (recovery/control/claims.py): True for the
        first ``consistent`` claim only; False too when the scheduler does not answer within
        ``cluster_time_out``. Needs no process group."""
        session = self._session
        if session is None:
            return False
        try:
            reply = session.link.call_until(
                Op.LAST_WORDS, time.monotonic() + session.timeouts.cluster_time_out,
                rank=self.rank, generation=self.generation, step=global_step,
                consistent=consistent, reason=reason)
        except SchedulerUnavailable as err:
            logger.warning("last-words claim for step %d not decided: %s", global_step, err)
            return False
        if not reply.get("ok"):
            logger.warning("last-words claim refused: %s", reply.get("message"))
            return False
        return bool(reply["save"])

    def peer_failed(self, cause: str) -> str:
        """Tell the scheduler that a collective failed on a peer for ``cause``; returns it."""
        if self._session is not None:
            report_peer_failure(self._session.link, self.rank, self.generation, cause)
        return cause

    @property
    def latest_generation(self) -> int:
        """The newest generation the scheduler has put this worker in, as of the last
        heartbeat: above :attr:`generation` once a new one is formed."""
        if self._session is None:
            return self.generation
        return max(self.generation, self._session.heartbeat.generation)

    @property
    def fault_at(self) -> float | None:
        """When the scheduler heard of the newest fault (unix time), as of its last reply;
        None when it knows of none (or there is no scheduler)."""
        return None if self._session is None else self._session.heartbeat.fault_at

    def look_for_news(self) -> None:
        """Ask the scheduler for news sooner than the next heartbeat (rate-limited), for a
        collective that takes long: it may be blocked on a dead peer only the scheduler
        knows of."""
        if self._session is not None:
            self._session.heartbeat.look_for_news()

    @property
    def join_pending(self) -> bool:
        """Whether this worker registered but joins no group before :meth:`complete_join`."""
        return self._join_pending

    def complete_join(self, should_abort: ShouldAbort = never) -> None:
        """Say this worker is ready and join the next generation: a relaunched rank registers
        unready, in a group of its own, so that the others train on while it builds its model.

        Raises:
            ClusterError: no generation with it formed within ``cluster_time_out``.
            Aborted: ``should_abort()`` said so while waiting.
        """
        import torch.distributed as dist

        session = self._session
        assert session is not None and self._join_pending
        dist.destroy_process_group()  # the single-rank group it waited in
        session.heartbeat.ready = True
        deadline = time.monotonic() + session.timeouts.cluster_time_out
        session.heartbeat.beat()
        self._init_group(session.heartbeat.generation, deadline, should_abort)
        self._join_pending = False

    def rejoin(self, should_abort: ShouldAbort = never) -> None:
        """Leave this generation's process group and join the next one the scheduler forms;
        call it once every reference to the old group's objects is dropped
        (docs/architecture.md), so that peers blocked on this process are released.

        Raises:
            ClusterError: no newer generation formed within ``cluster_time_out``, or this
                worker runs without a scheduler.
            Aborted: ``should_abort()`` said so while waiting (the old group is left).
        """
        session = self._session
        if session is None:
            raise ClusterError("rejoin() needs a scheduler (MS_SCHED_PORT)")
        self.leave_group()
        deadline = time.monotonic() + session.timeouts.cluster_time_out
        self._init_group(self._newer_generation(self.generation, deadline, should_abort),
                         deadline, should_abort)

    def leave_group(self) -> None:
        """Leave this generation's process group at once, even with a collective still in
        flight; nothing when there is none. Call it once every reference to the group's
        objects is dropped (docs/architecture.md).
        """
        import torch.distributed as dist

        gc.collect()
        if dist.is_initialized():
            group.retire()

    def finish(self, abnormal: bool = False, reason: str = "finished") -> None:
        """Stop heartbeating and tell the scheduler this process ends (called at exit).

        ``abnormal`` starts the node's cooldown, as any abnormal death does.
        """
        session, self._session = self._session, None
        if session is None:
            return
        session.heartbeat.stop()
        identity = {"node_id": self.node_id, "rank": self.rank, "pid": os.getpid(),
                    "incarnation": self.incarnation}
        if session.link.wait_connected(_LEAVE_WAIT):
            try:
                # Retried on a new connection: heartbeats go through the supervisor, so this
                # link's connection may have died unnoticed with a relaunched scheduler.
                session.link.call_until(Op.LEAVE, time.monotonic() + _LEAVE_WAIT, **identity,
                                        abnormal=abnormal, reason=reason)
            except SchedulerUnavailable as err:
                logger.warning("could not tell the scheduler this worker ends: %s", err)
        session.link.close()

    def enter_whole(self, form: FormGroup, after: int | None = None,
                    should_abort: ShouldAbort = never) -> None:
        """Enter the first generation after ``after`` (None: the one this worker registered
        into) that has every rank, and form its group with ``form``, which for a worker whose
        own code initialises the process group only prepares what that code needs.

        Raises:
            ClusterError: none formed within ``cluster_time_out``.
            Aborted: ``should_abort()`` said so while waiting.
        """
        session = self._session
        assert session is not None
        deadline = time.monotonic() + session.timeouts.cluster_time_out
        generation = (self.generation if after is None
                      else self._newer_generation(after, deadline, should_abort))
        self._init_group(generation, deadline, should_abort, form, whole=True)

    def _init_group(self, generation: int, deadline: float, should_abort: ShouldAbort = never,
                    form: FormGroup | None = None, whole: bool = False) -> None:
        """Initialise the default process group of ``generation`` once it is formed, or of a
        newer one when a member dies first (or, ``whole``, while it lacks a rank)."""
        import torch.distributed as dist
        from torch.distributed import DistNetworkError

        session = self._session
        assert session is not None

        def connect(store: Any, group_rank: int, size: int) -> bool:
            return group.connect(self.backend, store, group_rank, size,
                                 session.timeouts.heartbeat_timeout, session.group_timeout)

        form = form or connect

        def superseded(candidate: int) -> Callable[[], bool]:
            # Bound to this attempt's generation, not to the loop variable.
            return lambda: session.heartbeat.generation > candidate

        while True:
            ready = wait_for_generation(
                session.link, generation, deadline, session.timeouts, self.world_size,
                self.rank, superseded(generation), should_abort)
            if ready is None:
                newer = session.heartbeat.generation
                logger.info("[worker %s/%d] generation %d was superseded by %d before it "
                            "was ready", self.node_id, self.incarnation, generation, newer)
                generation = newer
                continue
            client, active = ready
            if self.rank not in active or (whole and len(active) < self.world_size):
                # Formed before this worker was ready (survivors shrinking again), or
                # degraded when a whole one is wanted: the next one takes it in.
                generation = self._newer_generation(generation, deadline, should_abort)
                continue
            store = dist.PrefixStore(generation_prefix(session.link.key, generation), client)
            group_rank = active.index(self.rank)
            try:
                if group.meet(store, group_rank, len(active), superseded(generation),
                              deadline, should_abort) \
                        and form(store, group_rank, len(active)):
                    break
            except DistNetworkError:
                continue  # the scheduler died: its relaunch announces the generation again
            logger.warning("[worker %s/%d] generation %d did not form; waiting for the next",
                           self.node_id, self.incarnation, generation)
            generation = self._newer_generation(generation, deadline, should_abort)
        self.generation = generation
        self.active = tuple(active)
        logger.info("[worker %s/%d] rank %d of %d in generation %d (%d members)", self.node_id,
                    self.incarnation, self.rank, self.world_size, generation, len(active))

    def _newer_generation(self, generation: int, deadline: float,
                          should_abort: ShouldAbort) -> int:
        """Wait until the scheduler has put this worker in a generation after ``generation``."""
        session = self._session
        assert session is not None
        while session.heartbeat.generation <= generation:
            if should_abort():
                raise Aborted(f"stopped waiting for a generation after {generation}")
            if time.monotonic() > deadline:
                message = (f"no generation after {generation} formed within "
                           f"cluster_time_out={session.timeouts.cluster_time_out:g}s")
                logger.error("%s", message)
                raise ClusterError(message)
            time.sleep(_REJOIN_POLL)
            session.heartbeat.beat()
        return session.heartbeat.generation

    def _finish_at_exit(self) -> None:
        """Finish, then end the process at once if a thread is still blocked in torch:
        exiting normally would abort in the C++ runtime."""
        abnormal = self._failed
        self.finish(abnormal, "uncaught exception" if abnormal else "finished")
        if self.stop_status is not None and not abnormal:
            # A collective may be in flight on a stuck peer; torch's teardown would wait for
            # it past the launcher's grace period.
            exit_now(self.stop_status)
        if group.exit_blocked(_RETIRED_GROUP_WAIT):
            # Status 0, or 1 after an uncaught exception.
            logger.warning("an old process group is still blocked on a peer; exiting without waiting for it")
            exit_now(1 if abnormal else 0)

    def _note_uncaught(self, hook: Any) -> Any:
        def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
            self._failed = True
            hook(kind, value, tb)
        return excepthook


def init(backend: str | None = None, timeout: timedelta | None = None) -> ClusterContext:
    """Join the cluster and initialise the default process group.

    Args:
        backend: ``gloo`` (default) or ``nccl`` (used when CUDA is available).
        timeout: the process group's timeout (torch's default when ``None``).

    Returns:
        This worker's :class:`ClusterContext`; with ``MS_ROLE=MS_SCHED`` the process runs
        the scheduler and exits instead.

    Raises:
        RegistrationRefused: a :class:`ClusterError`: refused for good; uncaught, exit 77.
        UnsafeFolder: the log dir or recovery path is not the user's own; uncaught, exit 2.
        ClusterError: the cluster did not complete within ``cluster_time_out``.
    """
    worker_env = folders.checked(WorkerEnv.from_env())
    if worker_env.is_scheduler:
        from recovery.control import scheduler

        sys.exit(scheduler.main())
    backend = _backend(backend)
    if names.MS_SCHED_PORT not in os.environ:
        ctx = _init_without_scheduler(worker_env, backend, timeout)
    else:
        ctx = _join(worker_env, backend, timeout)
    global _joined
    _joined = ctx
    return ctx


def joined() -> ClusterContext | None:
    """What :func:`init` returned in this process, if it was called."""
    return _joined


def _backend(asked: str | None) -> str:
    if asked in (None, "gloo"):
        return "gloo"
    import torch

    if asked == "nccl" and not torch.cuda.is_available():
        logger.warning("nccl asked for but CUDA is not available; using gloo")
        return "gloo"
    return asked


def _init_without_scheduler(worker_env: WorkerEnv, backend: str,
                            timeout: timedelta | None) -> ClusterContext:
    import torch.distributed as dist

    if worker_env.world_size > 1:
        dist.init_process_group(backend, timeout=timeout)  # torchrun's env://
    else:
        _group_of_one(backend, timeout)
    return ClusterContext(dist.get_rank(), dist.get_world_size(), 0, worker_env.node_id,
                          worker_env.incarnation, backend)


def _identity(worker_env: WorkerEnv) -> Identity:
    """This process's claim: node id and rank only when given, a fresh incarnation by hand."""
    environ = os.environ
    incarnation = (worker_env.incarnation if names.TFT_INCARNATION in environ
                   else time.time_ns() // 1_000_000)
    rank = int(environ[names.RANK]) if environ.get(names.RANK, "").isdigit() else None
    return Identity(environ.get(names.MS_NODE_ID, ""), os.getpid(), incarnation,
                    socket.gethostname(), rank)


def join() -> ClusterContext:
    """Register with the scheduler (``MS_SCHED_PORT``) and heartbeat, but form no process
    group: the caller enters generations with :meth:`ClusterContext.enter_whole`."""
    return _join(folders.checked(WorkerEnv.from_env()), "gloo", None, form_group=False)


def _join(worker_env: WorkerEnv, backend: str, timeout: timedelta | None,
          form_group: bool = True) -> ClusterContext:
    timeouts = Timeouts.from_env()
    deadline = time.monotonic() + timeouts.cluster_time_out
    try:
        token = checked_token(worker_env.job_token, worker_env.insecure_no_token)
    except MissingToken as err:
        logger.error("%s", err)
        raise RegistrationRefused(str(err)) from None
    link = SchedulerLink(worker_env.sched_host, worker_env.sched_port, token, REPLY_TIMEOUT,
                         run_id=worker_env.run_id, epoch=worker_env.epoch)
    # Registration and heartbeats go to the node's supervisor (which beats once for the
    # node) when TFT_BEAT_SOCKET is set, else to the scheduler.
    beat_socket = os.environ.get(names.TFT_BEAT_SOCKET)
    beats = LocalLink(beat_socket, REPLY_TIMEOUT, token) if beat_socket else link
    claim = _identity(worker_env)
    # A relaunched (or restarted) rank joins its group only in complete_join().
    defer = form_group and (worker_env.incarnation > 0 or worker_env.restart_count > 0)
    accepted = register(beats, claim, deadline, ready=not defer, whole=not form_group)
    rank, generation = int(accepted["rank"]), int(accepted["generation"])
    identity = Identity(accepted["node_id"], claim.pid, claim.incarnation, claim.host, rank)
    heartbeat = Heartbeat(beats, identity, timeouts.beat_interval, generation,
                          news_every=timeouts.heartbeat_interval,
                          look_every=news_look_interval(worker_env.world_size,
                                                        timeouts.heartbeat_interval),
                          stragglers=StragglerSettings.from_env(os.environ))
    heartbeat.accepted(accepted)
    heartbeat.ready = False if defer else None
    heartbeat.start()
    ctx = ClusterContext(rank, worker_env.world_size, generation,
                         identity.node_id, identity.incarnation, backend,
                         _Session(link, heartbeat, timeouts, timeout))
    sys.excepthook = ctx._note_uncaught(sys.excepthook)
    atexit.register(ctx._finish_at_exit)
    # So that leave_group's collection, on every survivor's critical path, scans only what
    # was made since; before any process group, so none is ever frozen.
    gc.freeze()
    if defer:
        ctx._join_pending = True
        _group_of_one(backend)  # until the join: the script's set-up (its DDP) runs alone
        logger.info("[worker %s/%d] registered as rank %d; joins once its training loop is "
                    "ready (ElasticTrainer and recovery.attach say so; a loop of the script's "
                    "own calls complete_join())", identity.node_id, identity.incarnation, rank)
    elif form_group:
        ctx._init_group(generation, deadline)
    return ctx


def _group_of_one(backend: str, timeout: timedelta | None = None) -> None:
    """A default group of this process alone: a job of one rank, or a relaunched rank
    until its join."""
    import torch.distributed as dist

    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timeout)
