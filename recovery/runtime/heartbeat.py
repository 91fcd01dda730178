"""A worker's heartbeat: a background thread that tells the scheduler it is alive, and where.

Each beat carries the process's identity, its latest step and phase (``report_step`` and
``report_phase`` only set an attribute, so the training loop pays nothing). Beats are
spaced to what the timeouts need (``Timeouts.beat_interval``: 6 s at the defaults); in
between, the thread reads the scheduler's news counter every ``news_every`` seconds and
beats at once when it moved (recovery/control/rpc.py), so that a new generation or an
injection reaches the worker as soon as with a beat a second. A reply may
carry fault injections for this rank (recovery/control/inject.py): they go to :attr:`Heartbeat.inbox`
for the training loop to take. When the scheduler dies, beats fail;
the link reconnects by itself and the next beat re-attaches the worker to the relaunched
scheduler: training goes on meanwhile, since gloo does not use the store after its
rendezvous (docs/architecture.md).

The thread never dies silently: what it sends is coerced (a step given as a tensor or a
numpy integer goes out as an ``int``; one that is no integer at all goes out as ``None``,
with a warning), and whatever else a beat raises is logged and the next beat tried.

A beat that is refused means the scheduler no longer counts this process as the holder
of its node id (declared dead, or replaced). Such a process must not go on talking to
the group, and nothing can interrupt a gloo call from another thread, so it exits.
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
"""Each wait for the next beat is up to this share of the interval shorter: thousands of
ranks that beat together after a new generation drift apart, and never further apart
than the interval (docs/scale.md)."""

EXIT_EVICTED = 75
"""Exit status of a worker the scheduler fenced off (EX_TEMPFAIL: a relaunch may succeed)."""

BLOCKED_LOOKS_PER_SECOND = 1000.0
"""About how many reads of the news counter a job's blocked ranks make per second when
they look for news sooner than their thread would (:meth:`Heartbeat.look_for_news`)."""
_SOONEST_LOOK = 0.05
"""Seconds between two looks of one rank at the soonest: the trainer's collective poll."""


def news_look_interval(world_size: int, news_every: float) -> float:
    """Seconds between two reads of the news counter that a rank blocked in a collective
    asks for: 0.05 s in a small job, spaced so that the job's blocked ranks read it about
    :data:`BLOCKED_LOOKS_PER_SECOND` times a second in a large one (the store serves
    them), and never later than the thread reads it anyway (``news_every``)."""
    return min(news_every, max(_SOONEST_LOOK, world_size / BLOCKED_LOOKS_PER_SECOND))


def _exit_evicted(message: str) -> None:
    sys.stderr.flush()
    os._exit(EXIT_EVICTED)


class Heartbeat:
    """Beats every ``interval`` seconds until stopped, and sooner when there is news.

    Args:
        link: the connection to the scheduler, or to the node's supervisor, which beats
            for the node (recovery/control/beat_channel.py).
        identity: this process, as the scheduler admitted it.
        interval: seconds between beats.
        on_evicted: called with the scheduler's message when a beat is refused; the
            default ends the process with :data:`EXIT_EVICTED`.
        news_every: seconds between reads of the scheduler's news counter; ``None`` (or
            not less than ``interval``): none, every beat comes every ``interval``.
        look_every: seconds between two reads asked for by :meth:`look_for_news`, at the
            soonest (:func:`news_look_interval`); ``None``: none is.
    """

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
        """Have the thread read the news counter now (and beat if it moved), unless a
        look was asked for less than ``look_every`` ago.

        For the training thread while its collective is blocked: a survivor that is no
        neighbour of a dead rank learns of the new generation only from the scheduler,
        and waiting for the thread's own next read (up to ``news_every``, a second)
        added that much to every recovery. Cheap: it sets an event.
        """
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

        The reply updates :attr:`generation`: the newest generation this process is in,
        or, while one is being formed with it, that one.
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
        """:attr:`global_step` as an ``int`` (``None`` with a warning when it is not an
        integer)."""
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
        """Take what a reply accepting this process says: the generation, when the
        newest fault was heard of, the fault injections for this rank."""
        self.generation = int(reply["generation"])
        fault_at = reply.get("fault_at")
        self.fault_at = None if fault_at is None else float(fault_at)
        self.receive(reply.get("inject", []))

    def receive(self, injections: list[dict[str, object]]) -> None:
        """Put fault injections the scheduler handed out (with a beat, or with the
        registration) in the :attr:`inbox`."""
        received = [Injection.from_json(raw) for raw in injections]
        for injection in received:
            logger.warning("%s received fault injection %s: %s %s", self._prefix, injection.id,
                           injection.fault, injection.when)
        self.inbox.add(received)

    def _run(self) -> None:
        failing: str | None = None  # the last beat's error: reported once, until a beat gets through
        next_beat = self._next_beat()
        while True:
            self._wake.wait(self._until(next_beat))
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

    def _until(self, next_beat: float) -> float:
        """How long to wait before looking again: until the next beat, or the next read
        of the news counter if that comes first."""
        left = max(0.0, next_beat - time.monotonic())
        return left if self._news_every is None else min(left, self._news_every)
