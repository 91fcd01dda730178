"""How far training is, for the live view: each rank's step and speed, the ETA, and what a recovery is doing,
read from the node's ``events.jsonl`` as it grows. Nothing here asks any process: a node without the scheduler
learns that a generation formed from its workers' next ``step``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.train.step_events import PAUSED, STEADY

__all__ = ["EventTail", "RankProgress", "Progress", "progress_bar", "format_eta", "RunSpan", "STEP_REPORTS",
           "run_span", "clock_time"]


READ_AT_MOST = 256 * 1024
"""Bytes one :meth:`EventTail.read` reads at most, so a pass of the supervisor's loop costs the same however
much the file grew."""


class EventTail:
    """The whole lines appended to an ``events.jsonl`` since the last call, at most :data:`READ_AT_MOST` bytes
    a call; behind by more, a tail that ``catches_up`` reads on at the next call, one that does not (the live
    view, which shows the present) skips to the newest :data:`READ_AT_MOST` bytes."""

    def __init__(self, path: Path, catches_up: bool = True) -> None:
        self._path = path
        self._offset = 0
        self._catches_up = catches_up

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self._path, "rb") as file:
                start = self._offset
                if not self._catches_up:
                    start = max(start, os.fstat(file.fileno()).st_size - READ_AT_MOST)
                file.seek(start)
                data = file.read(READ_AT_MOST)
        except OSError:
            return []
        if start > self._offset:  # jumped ahead, into a line: it starts after its end
            begin = data.find(b"\n") + 1
            start, data = start + begin, data[begin:]
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) >= READ_AT_MOST:
            end = len(data)  # a line longer than a whole read: unreadable, skipped
        self._offset = start + end
        events = []
        for line in data[:end].splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events


@dataclass(frozen=True)
class RankProgress:
    global_step: int
    """The step it reported last (its ``step`` event's ``step``)."""
    at: float
    rate: float | None
    """Steps per second between its last two reports of steady training (None before)."""
    why: str = STEADY
    """Why the last report was written (the step event's ``why``)."""


@dataclass
class Progress:
    """What the events read so far say about training."""

    ranks: dict[int, RankProgress] = field(default_factory=dict)
    total: int | None = None
    generation: int | None = None
    """The newest generation known to have formed (or to train)."""
    recovering: str | None = None
    """``re-forming generation g`` or ``resynchronising generation g`` while it lasts."""
    world: int | None = None
    """The ranks training now (the newest ``membership`` event's ``world``)."""
    worker_num: int | None = None
    """The job's ranks (its first ``membership`` event's ``world``)."""
    batch: int | None = None
    """Samples the newest reported step trained, job-wide (its ``step`` event's ``batch``)."""
    stragglers: set[int] = field(default_factory=set)
    """The ranks named stragglers (``straggler`` events), until a new process holds them."""
    _target: int | None = None

    def feed(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            handler = getattr(self, "_on_" + str(event.get("event")), None)
            if handler is not None:
                handler(event)

    def _on_step(self, event: dict[str, Any]) -> None:
        rank, global_step, ts = int(event["rank"]), int(event["step"]), float(event["ts"])
        before = self.ranks.get(rank)
        rate = before.rate if before is not None else None
        why = str(event.get("why", STEADY))
        # A speed needs steady training from the last report to this one: none paused between.
        if (before is not None and before.global_step < global_step and before.at < ts
                and why == STEADY and before.why != PAUSED):
            rate = (global_step - before.global_step) / (ts - before.at)
        self.ranks[rank] = RankProgress(global_step, ts, rate, why)
        if event.get("total") is not None:
            self.total = int(event["total"])
        if event.get("batch") is not None:
            self.batch = int(event["batch"])
        generation = event.get("generation")
        if generation is not None:
            self._trains_in(int(generation))

    def _on_straggler(self, event: dict[str, Any]) -> None:
        self.stragglers.add(int(event["rank"]))

    def _on_spawn(self, event: dict[str, Any]) -> None:
        if event.get("rank") is not None:
            self.stragglers.discard(int(event["rank"]))

    def _on_fault(self, event: dict[str, Any]) -> None:
        if event.get("cause") == "uce" or self.generation is None or self._target is not None:
            return  # repaired in place; a job without generations; one already re-forming
        self._target = self.generation + 1
        self.recovering = f"re-forming generation {self._target}"

    def _on_generation(self, event: dict[str, Any]) -> None:
        generation = int(event["generation"])
        self.generation = generation
        if self._target is not None:
            self._target = generation
            self.recovering = f"resynchronising generation {generation}"

    def _on_membership(self, event: dict[str, Any]) -> None:
        self.world = int(event["world"])
        self.worker_num = self.worker_num or self.world

    @property
    def degraded(self) -> str | None:
        """``degraded: W of N ranks, S samples/s`` while the job trains with ranks missing; None otherwise."""
        if self.world is None or self.worker_num is None or self.world >= self.worker_num:
            return None
        note = f"degraded: {self.world} of {self.worker_num} ranks"
        rate = self.rate  # samples per second: the steps' speed times the newest step's batch
        return note if rate is None or self.batch is None else f"{note}, {rate * self.batch:.0f} samples/s"

    def _on_recovered(self, event: dict[str, Any]) -> None:
        self._trains_in(int(event.get("generation") or 0))

    def _trains_in(self, generation: int) -> None:
        """A rank trains (or rolled back) in ``generation``: a recovery up to it is over."""
        self.generation = max(self.generation or 0, generation)
        if self._target is not None and generation >= self._target:
            self._target = self.recovering = None

    @property
    def global_step(self) -> int | None:
        """The job's step: the furthest rank's."""
        return max((r.global_step for r in self.ranks.values()), default=None)

    @property
    def rate(self) -> float | None:
        rates = [r.rate for r in self.ranks.values() if r.rate]
        return sum(rates) / len(rates) if rates else None

    def eta(self) -> float | None:
        """Seconds left at the current speed; None when unknown or while recovering."""
        global_step, rate = self.global_step, self.rate
        if self.total is None or global_step is None or not rate or self.recovering:
            return None
        return max(0, self.total - global_step) / rate


def clock_time(seconds: float) -> str:
    """``1:02:03``, or ``2:03`` under an hour."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_eta(seconds: float | None) -> str:
    return "ETA –" if seconds is None else f"ETA {clock_time(seconds)}"


def progress_bar(progress: Progress, width: int = 24) -> str:
    """``[#########...............] 40/100 40% 12.5 steps/s ETA 0:05`` (what is known)."""
    global_step = progress.global_step
    if global_step is None:
        return "no step reported yet"
    rate = f" {progress.rate:.1f} steps/s" if progress.rate else ""
    if not progress.total:
        return f"step {global_step}{rate}"
    done = min(1.0, global_step / progress.total)
    filled = int(done * width)
    return (f"[{'#' * filled}{'.' * (width - filled)}] {global_step}/{progress.total} "
            f"{done:.0%}{rate} {format_eta(progress.eta())}")


STEP_REPORTS = ("step", "train_end")
"""The events that say which global step a rank reached (``train_end``: its last)."""


@dataclass(frozen=True)
class RunSpan:
    """The run, for the end summary: this node's ``job_start`` (wall clock), the newest and total steps, and
    steps per second from the first report to the newest."""

    started: float | None
    final: int | None = None
    total: int | None = None
    rate: float | None = None


def run_span(path: Path) -> RunSpan:
    """The :class:`RunSpan` of the ``events.jsonl`` at ``path``, read from its head and tail only, so a long
    job's summary costs what a short one's does."""
    head, tail = EventTail(path).read(), EventTail(path, catches_up=False).read()
    started = next((float(e["ts"]) for e in head if e.get("event") == "job_start"), None)
    reports = [e for e in (*head, *tail) if e.get("event") in STEP_REPORTS and "step" in e]
    if not reports:
        return RunSpan(started)
    first = min(reports, key=lambda e: float(e["ts"]))
    last = max(reports, key=lambda e: (float(e["ts"]), int(e["step"])))
    final, seconds = int(last["step"]), float(last["ts"]) - float(first["ts"])
    total = next((int(e["total"]) for e in reversed(reports) if e.get("total") is not None), None)
    rate = (final - int(first["step"])) / seconds if seconds > 0 and final > int(first["step"]) else None
    return RunSpan(started, final, total, rate)
