"""The supervisor's one thread that talks to the scheduler and to the other nodes.

The loop queues exit reports and reads the latest snapshot without waiting, so that a stalled
scheduler delays no exit handling. In a large job, a round with nothing to report asks for the
status only when the beats said the scheduler's changes moved: a steady job's supervisors ask nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launcher.nodes.job_end import Over, parse_over
from launcher.nodes.link import NodeLink
from recovery.control.client import ExitReport, Retirement, SchedulerControl

__all__ = ["SchedulerWatch", "Scope", "Snapshot", "MemberRow", "Others", "NodesNews",
           "SNAPSHOT_INTERVAL", "STATUS_RATE", "snapshot_interval", "stale"]

logger = logging.getLogger(__name__)

SNAPSHOT_INTERVAL = 0.5
"""Seconds between two status snapshots (the scheduler's verdicts come with them), in a
job of up to :data:`STATUS_RATE` / 2 nodes."""
STATUS_RATE = 256
"""Status requests a second the job's supervisors send at most between them, unprompted:
each costs the scheduler's one loop about as much as a beat. Exits and news still ask at once."""
_JOIN = 5.0
"""Seconds :meth:`SchedulerWatch.close` waits for a round trip in flight."""


@dataclass(frozen=True)
class MemberRow:
    """One row of the scheduler's membership table."""

    rank: int
    node_id: str
    pid: int
    state: str
    """recovery.control.members.MemberState's value: ``alive``, ``lost``, ``finished``..."""
    global_step: int | None
    cooldown_left: float


@dataclass(frozen=True)
class Scope:
    """What a node asks the scheduler about: its own ranks, and whether the missing ones."""

    own: range
    missing: bool = False
    """Node 0 of several reads which ranks are missing (which node is gone); the other
    nodes only how many of the others train or finished."""


@dataclass(frozen=True)
class Others:
    """The ranks of the other nodes, in counts."""

    training: int
    """Those with a live or finished process, not retired."""
    finished: int
    """Those whose process finished, or retired."""
    finished_step: int | None
    """The highest step a finished one reported; None: none."""


@dataclass(frozen=True)
class Snapshot:
    """The scheduler's status of a node (a ``status`` with its :class:`Scope`) at
    ``taken_at`` (monotonic)."""

    taken_at: float
    """When it was asked for: it shows every exit reported before."""
    members: tuple[MemberRow, ...]
    """The rows of the node's own ranks."""
    others: Others
    missing: tuple[int, ...] = ()
    """Ranks with no live process and no finished one, less the retired ones (asked for
    by node 0 of several only: empty on the others)."""
    missing_known: frozenset[int] = frozenset()
    """Those of :attr:`missing` that registered once."""
    retired: frozenset[int] = frozenset()
    """Ranks retired for good (degraded training), until they register again."""
    facts: int | None = None
    """The scheduler's count of changes when it answered (None: it did not say)."""

    @classmethod
    def parse(cls, status: dict[str, Any], taken_at: float) -> Snapshot | None:
        """The snapshot of a node's ``status`` reply; None (logged) when it is malformed."""
        try:
            members = tuple(
                MemberRow(int(m["rank"]), str(m["node_id"]), int(m["pid"]), str(m["state"]),
                       None if m.get("step") is None else int(m["step"]),
                       float(m.get("cooldown_left") or 0.0))
                for m in status["members"])
            others = status["others"]
            step = others["finished_step"]
            counts = Others(int(others["training"]), int(others["finished"]),
                            None if step is None else int(step))
            missing = tuple(int(r) for r in status.get("missing", ()))
            known = frozenset(int(r) for r in status.get("missing_known", ()))
            retired = frozenset(int(r) for r in status["retired"])
            facts = status.get("facts")
            facts = None if facts is None else int(facts)
        except (KeyError, TypeError, ValueError, AttributeError):
            logger.warning("ignoring a malformed status reply: %.200r", status)
            return None
        return cls(taken_at, members, counts, missing, known, retired, facts)


@dataclass(frozen=True)
class NodesNews:
    """What the cluster store on node 0 said last (with other nodes only)."""

    restarts_started: int = 0
    """The highest group restart any node started."""
    ended: str = ""
    """Why another node ended the job for all ('' while none did)."""
    reachable: bool = True
    over: Over | None = None
    """What node 0 said of the job's end, once it ended (launcher/nodes/job_end.py)."""
    over_at: float = 0.0
    """When (monotonic) this node first read it."""


def snapshot_interval(nodes: int) -> float:
    """Seconds between two of a node's snapshots in a job of ``nodes`` nodes."""
    return max(SNAPSHOT_INTERVAL, nodes / STATUS_RATE)


def stale(seen: int | None, heard: int | None) -> bool:
    """Whether a snapshot that showed the scheduler's count of changes ``seen`` may be
    out of date, now that a beat's reply said ``heard`` (None: unknown, so it may)."""
    return seen is None or seen != heard


class SchedulerWatch:
    """Delivers exit reports and keeps the latest :class:`Snapshot` and :class:`NodesNews`;
    ``wake`` is called (from the thread) after each round; ``nodes`` is a link of the thread's
    own, None on one node."""

    def __init__(self, control: SchedulerControl, nodes: NodeLink | None,
                 wake: Callable[[], None], scope: Scope,
                 interval: float = SNAPSHOT_INTERVAL) -> None:
        self._control = control
        self._scope = scope
        self._nodes = nodes
        self._wake = wake
        self._interval = interval
        self._spaced = interval > SNAPSHOT_INTERVAL
        """A large job: a round with nothing to report asks only when the count of
        changes a beat brought moved (:meth:`facts_heard`)."""
        self._facts_heard: int | None = None
        self._reports: list[ExitReport | Retirement] = []
        self._lock = threading.Lock()
        self._poked = threading.Event()
        self._closed = threading.Event()
        self._delivered = threading.Event()
        self._delivered.set()
        self._thread = threading.Thread(target=self._run, name="scheduler-watch", daemon=True)
        self.snapshot: Snapshot | None = None
        """The latest snapshot (replaced whole: reading it needs no lock)."""
        self.nodes = NodesNews()

    def start(self) -> None:
        self._thread.start()

    def report(self, report: ExitReport | Retirement) -> None:
        """Queue a worker's exit (or ranks retired) for the scheduler; delivered by the
        thread, in order."""
        with self._lock:
            self._reports.append(report)
            self._delivered.clear()
        self._poked.set()

    def poke(self) -> None:
        """Take a snapshot now: the scheduler has news (a verdict, a generation)."""
        self._poked.set()

    def facts_heard(self, facts: int) -> None:
        """A beat's reply said the scheduler's count of changes is ``facts`` (beat server's
        thread). It is only noted, not asked about at once: as a job forms every beat
        brings a new count, and many nodes asking would crowd the registrations out."""
        self._facts_heard = facts

    def delivered(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for every queued report to be handed to the client (which
        keeps the ones the scheduler did not take, and sends them again)."""
        self._poked.set()
        return self._delivered.wait(timeout)

    def close(self) -> None:
        self._closed.set()
        self._poked.set()
        if self._thread.is_alive():
            self._thread.join(_JOIN)
        if self._nodes is not None:
            self._nodes.close()

    def _run(self) -> None:
        while not self._closed.is_set():
            poked = self._poked.wait(self._interval)
            self._poked.clear()
            if self._closed.is_set():
                return
            try:
                self._round(poked)
            except Exception:  # noqa: BLE001 - the thread must outlive any bad answer
                logger.exception("the scheduler watch failed a round; trying again")
            self._wake()

    def _round(self, poked: bool) -> None:
        with self._lock:
            reports, self._reports = self._reports, []
        for report in reports:
            self._control.report(report)
        with self._lock:
            if not self._reports:
                self._delivered.set()
        if reports or poked or self._may_be_stale():
            self._take_snapshot()
        if self._nodes is not None:
            started = self._nodes.restarts_started()
            ended = self._nodes.ended()
            over = self.nodes.over or parse_over(self._nodes.ended_on_node_0())
            self.nodes = NodesNews(max(self.nodes.restarts_started, started or 0),
                                   ended or self.nodes.ended, self._nodes.reachable, over,
                                   self.nodes.over_at or (time.monotonic() if over else 0.0))

    def _may_be_stale(self) -> bool:
        """Whether a spaced round must ask: every round does but in a large job, where
        one asks only when the beats said the count of changes moved, or said nothing."""
        snapshot = self.snapshot
        return not self._spaced or snapshot is None or stale(snapshot.facts, self._facts_heard)

    def _take_snapshot(self) -> None:
        asked = time.monotonic()  # the snapshot shows every report queued before it
        scope = self._scope
        status = self._control.node_status(scope.own.start, len(scope.own), scope.missing)
        if status is not None:
            snapshot = Snapshot.parse(status, asked)
            self.snapshot = snapshot or self.snapshot
