"""Fault injection: what ``tftctl inject`` asks for, and how a worker carries it out.

An :class:`Injection` waits in the scheduler's persisted queue and rides, at most once, on the next
heartbeat reply to its rank (docs/fault-injection.md).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from recovery.faults import DeviceError

__all__ = ["FAULTS", "Injection", "InjectedError", "Inbox", "InjectionQueue", "check",
           "check_fault", "deliver", "new_id", "MAX_SLOW_FACTOR"]

logger = logging.getLogger(__name__)

FAULTS = ("kill", "term", "hang", "uce", "exception", "slow")
MAX_SLOW_FACTOR = 1000.0
_HANG_WAKEUP = 3600.0


class InjectedError(RuntimeError):
    """The ordinary exception ``--fault exception`` raises: a bug in the step, not recoverable."""


@dataclass(frozen=True)
class Injection:
    """One fault (one of :data:`FAULTS`) to carry out in the worker holding ``rank``. Due at global
    step ``at_step`` or after (``None``: the next step); ``factor``: for ``slow``, how many times
    slower the rank's steps become."""

    id: str
    rank: int
    fault: str
    at_step: int | None
    factor: float | None = None

    def due(self, global_step: int) -> bool:
        return self.at_step is None or self.at_step <= global_step

    @property
    def when(self) -> str:
        return "at the next step" if self.at_step is None else f"at step {self.at_step}"

    def to_json(self) -> dict[str, Any]:
        """Its fields; ``factor`` only for ``slow``."""
        data = asdict(self)
        if self.factor is None:
            del data["factor"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Injection:
        at_step = data.get("at_step")
        factor = data.get("factor")
        return cls(str(data["id"]), int(data["rank"]), str(data["fault"]),
                   None if at_step is None else int(at_step),
                   None if factor is None else float(factor))


def new_id() -> str:
    return uuid.uuid4().hex[:12]


def check_fault(fault: str, at_step: int | None, factor: float | None = None) -> str | None:
    """Why ``fault`` at ``at_step`` (``slow`` by ``factor``) is invalid in any job, or ``None``."""
    if fault not in FAULTS:
        return f"unknown fault {fault!r} (one of {', '.join(FAULTS)})"
    if at_step is not None and at_step < 1:
        return f"at_step must be at least 1, got {at_step}"
    if fault == "slow" and (factor is None or not 1 < factor <= MAX_SLOW_FACTOR):
        return f"--fault slow needs --factor above 1 and at most {MAX_SLOW_FACTOR:g}, got {factor}"
    if fault != "slow" and factor is not None:
        return f"--factor is for --fault slow only, not {fault}"
    return None


def check(rank: int, fault: str, at_step: int | None, worker_num: int,
          factor: float | None = None) -> str | None:
    """Why an injection request is invalid in a job of ``worker_num``, or ``None``."""
    if not 0 <= rank < worker_num:
        return f"rank {rank} is beyond worker_num={worker_num} (ranks are 0..{worker_num - 1})"
    return check_fault(fault, at_step, factor)


class Inbox:
    """The injections a worker received and has not carried out yet (thread-safe).

    The training loop takes once per step, so taking from an empty inbox costs only a length check.
    """

    def __init__(self) -> None:
        self._items: list[Injection] = []
        self._lock = threading.Lock()

    def add(self, injections: Iterable[Injection]) -> None:
        with self._lock:
            self._items.extend(injections)

    def take_due(self, global_step: int) -> Injection | None:
        """Remove and return the oldest injection due at ``global_step``; ``None`` if none."""
        if not self._items:
            return None
        with self._lock:
            for index, injection in enumerate(self._items):
                if injection.due(global_step):
                    return self._items.pop(index)
        return None


class InjectionQueue:
    """The scheduler's injections not yet handed to their rank, oldest first (persisted); a rank being
    relaunched gets them on its new process's first heartbeat."""

    def __init__(self) -> None:
        self.pending: list[Injection] = []

    def add(self, injection: Injection) -> None:
        self.pending.append(injection)

    def take(self, rank: int) -> list[Injection]:
        """Remove and return the injections for ``rank``: they are handed out once only."""
        taken = [i for i in self.pending if i.rank == rank]
        if taken:
            self.pending = [i for i in self.pending if i.rank != rank]
        return taken

    def to_json(self) -> list[dict[str, Any]]:
        return [i.to_json() for i in self.pending]

    @staticmethod
    def parse(data: list[dict[str, Any]]) -> list[Injection]:
        """The injections of :meth:`to_json`'s output; raises on a malformed entry."""
        return [Injection.from_json(raw) for raw in data]


def deliver(injection: Injection) -> None:
    """Carry the fault out in this (worker) process, now. ``kill`` and ``hang`` do not return; ``term``
    returns once the signal is sent; ``uce`` and ``exception`` raise; ``slow`` is only logged
    (``ElasticTrainer`` carries it out)."""
    where = f"(injection {injection.id}) {injection.when}"
    if injection.fault in ("kill", "term"):
        sent = signal.SIGKILL if injection.fault == "kill" else signal.SIGTERM
        logger.warning("injected %s %s: %s to myself", injection.fault, where, sent.name)
        os.kill(os.getpid(), sent)
    elif injection.fault == "hang":
        logger.warning("injected hang %s: this rank stops making progress", where)
        forever = threading.Event()
        while not forever.wait(_HANG_WAKEUP):
            pass
    elif injection.fault == "uce":
        raise DeviceError(f"injected uncorrectable device error {where}")
    elif injection.fault == "exception":
        raise InjectedError(f"injected exception {where}")
    elif injection.fault == "slow":
        logger.warning("injected slow %s: ignored, only ElasticTrainer's steps can be slowed", where)
    else:
        raise ValueError(f"unknown fault {injection.fault!r} (one of {', '.join(FAULTS)})")
