"""``@recovery.restartable``: a plain script's entry point, called again in the surviving
processes when a peer dies (docs/recovery.md, "In-process restart"). The function keeps its
own ``env://`` group, so it runs only in whole generations, each with a fresh c10d store
hosted by rank 0 (``env://`` puts no prefix on its keys). The rank registers ``whole``, so
its own death starts no cooldown (recovery/control/membership.py)."""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from recovery import env as names
from recovery.env import WorkerEnv
from recovery.events import EventLog
from recovery.peer_loss import first_line
from recovery.runtime import cluster
from recovery.timeouts import Timeouts

__all__ = ["restartable", "Restarts", "on_next_fault"]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

_ADDRESS_KEY = "tft/restartable/store"
_POLL = 0.02
_WATCH_POLL = 0.1
_STORE_TIMEOUT = timedelta(seconds=60)


_fault_listeners: list[Callable[[BaseException], None]] | None = None
"""The current call's listeners; None outside a restartable call."""


def on_next_fault(listener: Callable[[BaseException], None]) -> bool:
    """Have ``listener`` called with the current call's exception if a peer's fault ends it,
    before the exception is dropped; False outside a restartable call."""
    if _fault_listeners is None:
        return False
    _fault_listeners.append(listener)
    return True


def restartable(fn: Callable[P, R]) -> Callable[P, R]:
    """Call ``fn`` again, in this process, each time a peer's death breaks its collectives.

    Without a scheduler (plain torchrun, or run alone) ``fn`` is called once, unchanged;
    under ``MS_ROLE=MS_SCHED`` the process runs the scheduler, as ``recovery.init()`` does."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        worker_env = WorkerEnv.from_env()
        if worker_env.is_scheduler:
            from recovery.control import scheduler

            sys.exit(scheduler.main())
        if names.MS_SCHED_PORT not in os.environ:
            return fn(*args, **kwargs)
        return Restarts(fn.__name__, worker_env).run(functools.partial(fn, *args, **kwargs))

    return call


class Restarts:
    """One rank's calls of the function, one per whole generation."""

    def __init__(self, name: str, worker_env: WorkerEnv) -> None:
        self._name = name
        self._host = worker_env.master_addr
        self._events = EventLog(worker_env.log_dir, worker_env.node_rank)
        self._calls = 0
        self._timeouts = Timeouts.from_env()
        self._ctx = cluster.join()
        self._server: Any = None
        self._done = threading.Event()

    def run(self, fn: Callable[[], R]) -> R:
        """Call ``fn`` in each whole generation until a call returns."""
        from recovery.runtime import torch_compat  # checks torch's version: not for a call without tftrun

        after: int | None = None
        while True:
            self._ctx.enter_whole(self._form, after)
            self._calls += 1
            # Read by tftrun at once, so that a relaunched rank is not stopped as stranded
            # when its peers finish first.
            self._events.emit("function_call", rank=self._ctx.rank, pid=os.getpid(),
                              incarnation=self._ctx.incarnation,
                              generation=self._ctx.generation, call=self._calls,
                              function=self._name)
            fault_seen = self._ctx.fault_at
            listeners: list[Callable[[BaseException], None]] = []
            _listen(listeners)
            watch = self._watch(fault_seen) if self._server is not None else None
            try:
                return fn()
            except RuntimeError as err:
                if not self._peer_failed(fault_seen):
                    raise
                logger.warning("[rank %d] a peer failed in generation %d (%s): calling %s "
                               "again once its replacement has joined", self._ctx.rank,
                               self._ctx.generation, first_line(err), self._name)
                for listener in listeners:
                    listener(err)
            finally:
                _listen(None)
                self._done.set()
                if watch is not None:
                    watch.join()
                self._done.clear()
            # Outside the except block: the traceback, which holds the broken group through
            # the function's frames, is gone.
            after = self._ctx.generation
            self._server = None
            self._ctx.leave_group()
            torch_compat.reset_group_count()

    def _form(self, store: Any, group_rank: int, size: int) -> bool:
        """Set the env that the function's ``env://`` reads, for this generation's own store."""
        if group_rank == 0:
            from torch.distributed import TCPStore

            self._server = None
            self._server = TCPStore(self._host, 0, is_master=True, wait_for_workers=False,
                                    timeout=_STORE_TIMEOUT)
            store.set(_ADDRESS_KEY, f"{self._host}:{self._server.port}")
        deadline = time.monotonic() + self._timeouts.heartbeat_timeout
        while not store.check([_ADDRESS_KEY]):
            if time.monotonic() > deadline:
                return False  # the generation's rank 0 died after the members met
            time.sleep(_POLL)
        host, _, port = store.get(_ADDRESS_KEY).decode().rpartition(":")
        os.environ.update({names.RANK: str(group_rank), names.WORLD_SIZE: str(size),
                           names.MASTER_ADDR: host, names.MASTER_PORT: port,
                           names.TORCHELASTIC_USE_AGENT_STORE: "True"})
        return True

    def _faulted(self, fault_seen: float | None) -> bool:
        return (self._ctx.latest_generation > self._ctx.generation
                or self._ctx.fault_at != fault_seen)

    def _peer_failed(self, fault_seen: float | None) -> bool:
        """Whether the scheduler reports a fault since the call began, within the heartbeat
        timeout (within which a dead or frozen rank is declared so)."""
        deadline = time.monotonic() + self._timeouts.heartbeat_timeout
        while not self._faulted(fault_seen):
            if time.monotonic() > deadline:
                return False
            self._ctx.look_for_news()
            time.sleep(_POLL)
        return True

    def _watch(self, fault_seen: float | None) -> threading.Thread:
        """Close this generation's store once a fault is reported while the function runs, so
        that a rank waiting in ``init_process_group`` for a dead member raises at once."""

        def watch() -> None:
            while not self._done.wait(_WATCH_POLL):
                if self._faulted(fault_seen):
                    self._server = None  # waits on it in the ranks' rendezvous raise now
                    return

        thread = threading.Thread(target=watch, name="tft-restartable-watch", daemon=True)
        thread.start()
        return thread


def _listen(listeners: list[Callable[[BaseException], None]] | None) -> None:
    global _fault_listeners
    _fault_listeners = listeners

