"""The faults ``tftctl inject`` queues for this rank, carried out by the trainer at their step."""

from __future__ import annotations

import logging
import os

from recovery.control.inject import Injection, deliver
from recovery.events import EventLog
from recovery.faults import is_recoverable_device_error
from recovery.runtime.cluster import ClusterContext
from recovery.train.compute_clock import ComputeClock
from recovery.train.phase import StepPhase

__all__ = ["InjectedFaults"]

logger = logging.getLogger(__name__)


class InjectedFaults:
    """This rank's injected faults: a ``uce`` is raised inside the step, at its collective;
    any other is delivered as soon as its step starts."""

    def __init__(self, ctx: ClusterContext, phase: StepPhase, events: EventLog,
                 clock: ComputeClock) -> None:
        self._ctx = ctx
        self._phase = phase
        self._events = events
        self._clock = clock
        self._uce: Injection | None = None

    def take(self, global_step: int) -> None:
        """Carry out a fault injected for this step (``tftctl inject``)."""
        injection = self._ctx.pending_injection(global_step)
        if injection is None:
            return
        logger.warning("[rank %d] injected fault %s at step %d", self._ctx.rank, injection.fault,
                       global_step)
        if injection.fault == "uce":
            self._uce = injection  # raised inside the step, at its collective
        elif injection.fault == "slow":
            self._clock.slowdown = injection.factor or 1.0
        else:
            deliver(injection)

    def raise_uce(self) -> None:
        """Deliver the step's ``uce``, if one was taken; the recoverable device error it
        raises becomes the step's (``StepPhase.device_error``)."""
        injection, self._uce = self._uce, None
        if injection is None:
            return
        try:
            deliver(injection)
        except Exception as err:  # noqa: BLE001 - only a recoverable one is kept
            if not is_recoverable_device_error(err):
                raise
            self._phase.device_error = err
        self._events.emit("fault", rank=self._ctx.rank, pid=os.getpid(),
                          incarnation=self._ctx.incarnation, cause="uce",
                          step=self._phase.global_step, error=str(self._phase.device_error))
