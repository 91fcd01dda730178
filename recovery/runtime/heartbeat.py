"""A worker's heartbeat: a background thread that tells the scheduler it is alive, and where.

Between beats it reads the news counter and beats at once when it moved. Training goes on
while the scheduler is down, as gloo does not use the store after its rendezvous; a refused
beat (the node id is lost) exits, as nothing can interrupt a gloo call from another thread.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from recovery.control.beat_channel import LocalLink
from recovery.control.inject import Inbox, Injection
from recovery.control.members import Identity
from recovery.control.rpc import Op, SchedulerLink, SchedulerUnavailable
from recovery.control.stragglers import StepTimes, StragglerSettings

__all__ = ["Heartbeat", "EXIT_EVICTED", "news_look_interval", "JITTER"]

logger = logging.getLogger(__name__)

JITTER = 0.2
"""Each wait for the next beat is up to this share of the interval shorter, so that ranks
that beat together after a new generation drift apart (docs/scale.md)."""

EXIT_EVICTED = 75
"""Exit status of a worker the scheduler fenced off (EX_TEMPFAIL: a relaunch may succeed)."""

BLOCKED_LOOKS_PER_SECOND = 1000.0
"""About how many reads of the news counter a job's blocked ranks make per second in all
(:meth:`Heartbeat.look_for_news`)."""
_SOONEST_LOOK = 0.05
"""Seconds between two looks of one rank at the soonest: the trainer's collective poll."""


def news_look_interval(world_size: int, news_every: float) -> float:
    """Seconds between two reads of the news counter asked for by a rank blocked in a
    collective, spaced so that the job's blocked ranks together stay near
    :data:`BLOCKED_LOOKS_PER_SECOND`."""
    return min(news_every, max(_SOONEST_LOOK, world_size / BLOCKED_LOOKS_PER_SECOND))


def _exit_evicted(message: str) -> None:
    sys.stderr.flush()
    os._exit(EXIT_EVICTED)


class Heartbeat:
    """Beats every ``interval`` seconds through ``link`` (the scheduler, or the node's
    supervisor) until stopped, and sooner when the news counter, read every ``news_every``
    seconds (None: never) or on :meth:`look_for_news`, moved. ``on_evicted`` gets a refused
    beat's message; by default the process exits with :data:`EXIT_EVICTED`."""

    def __init__(self, link: SchedulerLink | LocalLink, identity: Identity, interval: float,
                 generation: int, on_evicted: Callable[[str], None] = _exit_evicted,
                 news_every: float | None = None, look_every: float | None = None,
                 stragglers: StragglerSettings | None = None) -> None:
        self.global_step: int | None = None
        """The latest step reported (``report_step``); each beat sends it as ``step``."""
        self.phase: str | None = None
        self.ready: bool | None = None
        """Sent with each beat: False while a deferred join waits for the training loop
        (recovery/runtime/cluster.py ``complete_join``), then True; None: not said."""
        self.inbox = Inbox()
        self.step_times = StepTimes(stragglers)
        """Compute times of the steps since the last beat; each beat sends their summary."""
        self._beat_due = False
        """A beat is due at once (:meth:`report_step_time`)."""
        self.generation = generation
        self.fault_at: float | None = None
        """When the scheduler heard of the newest fault (unix time; None: none yet), as of
        the last reply (recovery/control/membership.py)."""
        self._link = link
        self._fields = dataclasses.asdict(identity)
        self._interval = interval
        self._news_every = news_every if news_every is not None and news_every < interval \
            else None
        self._news_seen: int | None = None  # the news counter as of the last beat
        self._on_evicted = on_evicted
        self._lost = False
        self._unsendable_step_reported = False
        self._look_every = look_every
        self._looked_at = float("-inf")
        self._stop = threading.Event()
        self._wake = threading.Event()
        """Set to make the thread look at once: to stop, or for news."""
        self._thread = threading.Thread(target=self._run, name="tft-heartbeat", daemon=True)
        self._prefix = f"[worker {identity.node_id}/{identity.incarnation}]"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def look_for_news(self) -> None:
        """Have the thread read the news counter now (and beat if it moved), unless a look was
        asked for less than ``look_every`` ago: a survivor blocked in a collective that is no
        neighbour of a dead rank learns of the new generation only from the scheduler."""
        now = time.monotonic()
        if self._look_every is not None and now - self._looked_at >= self._look_every:
            self._looked_at = now
            self._wake.set()

    def report_step_time(self, seconds: float) -> None:
        """One step's compute time; a summary that is urgent is beaten at once."""
        if self.step_times.add(seconds):
            self._beat_due = True
            self._wake.set()

    def beat(self) -> bool:
        """Send one heartbeat now; False when the scheduler cannot be reached.

        The reply updates :attr:`generation`.
        """
        try:
            self._beat_due = False
            step_us, steps, urgent = self.step_times.take() or (None, None, False)
            reply = self._link.call(Op.HEARTBEAT, **self._fields, step=self._sendable_step(),
                                    phase=None if self.phase is None else str(self.phase),
                                    ready=self.ready, step_us=step_us, steps=steps,
                                    **({"urgent": True} if urgent else {}))
        except SchedulerUnavailable as err:
            if not self._lost:
                logger.warning("%s lost the scheduler (%s); training goes on, reconnecting",
                               self._prefix, err)
            self._lost = True
            return False
        if self._lost:
            logger.warning("%s re-attached to the scheduler", self._prefix)
            self._lost = False
        if reply.get("ok"):
            self.accepted(reply)
            return True
        message = str(reply.get("message"))
        logger.error("%s evicted by the scheduler: %s", self._prefix, message)
        self._stop.set()
        self._on_evicted(message)
        return False

    def _sendable_step(self) -> int | None:
        """:attr:`global_step` as an ``int`` (a tensor or numpy integer included), so the
        thread never dies of it; ``None`` with a warning when it is not an integer."""
        global_step = self.global_step
        if global_step is None:
            return None
        try:
            return operator.index(global_step)
        except TypeError:
            pass
        try:
            if float(global_step).is_integer():
                return int(global_step)  # a 0-d tensor or a float that holds an integer
        except (TypeError, ValueError, OverflowError):
            pass
        if not self._unsendable_step_reported:
            logger.warning("%s cannot send step %r (%s): not an integer; sending none",
                           self._prefix, global_step, type(global_step).__name__)
            self._unsendable_step_reported = True
        return None

    def accepted(self, reply: dict[str, Any]) -> None:
        """Take the generation, the newest fault's time and the fault injections (into the
        :attr:`inbox`) from a reply accepting this process."""
        self.generation = int(reply["generation"])
        fault_at = reply.get("fault_at")
        self.fault_at = None if fault_at is None else float(fault_at)
        received = [Injection.from_json(raw) for raw in reply.get("inject", [])]
        for injection in received:
            logger.warning("%s received fault injection %s: %s %s", self._prefix, injection.id,
                           injection.fault, injection.when)
        self.inbox.add(received)

    def _run(self) -> None:
        failing: str | None = None  # the last beat's error: reported once, until a beat gets through
        next_beat = self._next_beat()
        while True:
            left = max(0.0, next_beat - time.monotonic())  # or until the next news read, if sooner
            self._wake.wait(left if self._news_every is None else min(left, self._news_every))
            self._wake.clear()
            if self._stop.is_set():
                return
            news = None
            try:
                news = None if self._news_every is None else self._link.news()
                if news is None:
                    self._news_seen = None  # lost: beat once the (new) counter is read
                if time.monotonic() < next_beat and news in (None, self._news_seen) \
                        and not self._beat_due:
                    continue  # no beat due, no news
                sent = self.beat()
            except Exception as err:  # noqa: BLE001 - the thread must outlive any beat
                if failing != repr(err):
                    logger.error("%s a heartbeat failed (beating on): %r", self._prefix, err,
                                 exc_info=err)
                failing, sent = repr(err), False
            else:
                failing = None if sent else failing
            if sent and news is not None:
                self._news_seen = news
            if not sent:
                self._link.wait_connected(self._interval)
            next_beat = self._next_beat()

    def _next_beat(self) -> float:
        return time.monotonic() + self._interval * random.uniform(1 - JITTER, 1)
