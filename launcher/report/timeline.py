"""A job's timeline (unix seconds), built from every node's events: what ``tftctl report`` draws. Pure, so that
the renderers (svg.py, page.py, trace.py) agree. A recovery runs from the first ``fault`` to ``recovered``:
*re-forming* until the next ``generation``, then *resynchronising* until the ``rollback``; a ``membership`` with
fewer ranks than the first opens a *degraded* span, closed by the next."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.report.fields import drawable, well_typed
from launcher.report.model import (
    DegradedSpan,
    FaultMark,
    GenerationMark,
    Incarnation,
    IncarnationEnding,
    Lane,
    PhaseSpan,
    Recovery,
    SpanPhase,
    StepPoint,
    Timeline,
)
from recovery.train.step_events import RESTORED

__all__ = ["build_timeline"]


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass
class _Episode:
    faults: list[FaultMark]
    formed_before: int | None
    """The newest generation when the first fault came (None: the job had none)."""
    reached: int | None
    generation_at: float | None = None
    generation: int | None = None
    restart: str | None = None
    rollback: dict[str, Any] | None = None


@dataclass
class _Builder:
    """Walks the events in time order; :meth:`timeline` assembles what it saw."""

    end: float
    live: bool
    start: float | None = None
    run_id: str = ""
    node_ends: dict[int, dict[str, Any]] = field(default_factory=dict)
    node_starts: set[int] = field(default_factory=set)
    lanes: set[Lane] = field(default_factory=set)
    running: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    """(rank, pid) -> its spawn event, until its exit."""
    hung: set[tuple[int, int]] = field(default_factory=set)
    incarnations: list[Incarnation] = field(default_factory=list)
    faults: list[FaultMark] = field(default_factory=list)
    cooldowns: list[tuple[int, float, float]] = field(default_factory=list)
    spawns: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    current: dict[int, int] = field(default_factory=dict)
    """rank -> its newest incarnation."""
    generations: list[GenerationMark] = field(default_factory=list)
    episode: _Episode | None = None
    episodes: list[_Episode] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    high: int | None = None
    steps: dict[int, list[StepPoint]] = field(default_factory=lambda: defaultdict(list))
    total: int | None = None
    digests: dict[int, str] = field(default_factory=dict)
    restarts: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    relaunches: int = 0
    worker_num: int | None = None
    """The ranks of the job's first generation (its ``membership`` event's ``world``)."""
    degraded: list[DegradedSpan] = field(default_factory=list)
    shrunk: dict[str, Any] | None = None
    """The ``membership`` event of the degraded stretch under way (None: none)."""
    stragglers: list[tuple[int, float]] = field(default_factory=list)
    """(rank, when) of each ``straggler`` event."""

    def feed(self, event: dict[str, Any]) -> None:
        handler = getattr(self, "_on_" + str(event.get("event")), None)
        if handler is not None:
            handler(event, int(event.get("node_rank") or 0))

    # ------------------------------------------------------------------ supervisor
    def _on_job_start(self, event: dict[str, Any], node: int) -> None:
        self.start = event["ts"] if self.start is None else min(self.start, event["ts"])
        self.run_id = self.run_id or str(event.get("run_id", ""))
        self.node_starts.add(node)

    def _on_job_end(self, event: dict[str, Any], node: int) -> None:
        self.node_ends[node] = event

    def _on_spawn(self, event: dict[str, Any], node: int) -> None:
        if event.get("role") != "worker" or event.get("rank") is None:
            return
        rank = int(event["rank"])
        self.lanes.add(Lane(node, rank))
        self.running[(rank, int(event["pid"]))] = event
        self.spawns[rank].append(event["ts"])
        self.current[rank] = int(event.get("incarnation") or 0)

    def _on_hang(self, event: dict[str, Any], node: int) -> None:
        self.hung.add((int(event["rank"]), int(event["pid"])))

    def _on_exit(self, event: dict[str, Any], node: int) -> None:
        if event.get("role") != "worker" or event.get("rank") is None:
            return
        key = (int(event["rank"]), int(event["pid"]))
        spawn = self.running.pop(key, None)
        if spawn is None:
            return
        if event.get("expected"):
            ending = IncarnationEnding.STOPPED
        elif event.get("exitcode") == 0:
            ending = IncarnationEnding.SUCCEEDED
        else:
            ending = IncarnationEnding.HUNG if key in self.hung else IncarnationEnding.FAILED
        how = event.get("signal") or f"exit code {event.get('exitcode')}"
        self.incarnations.append(Incarnation(key[0], int(spawn.get("incarnation") or 0),
                                             key[1], spawn["ts"], event["ts"], ending, how))

    def _on_fault(self, event: dict[str, Any], node: int) -> None:
        fault = FaultMark(event["ts"], _optional_int(event.get("rank")), str(event.get("cause")),
                          _optional_int(event.get("pid")), _optional_int(event.get("incarnation")))
        self.faults.append(fault)
        if self.episode is None:
            formed = self.generations[-1].generation if self.generations else None
            self.episode = _Episode([], formed, self.high)
            self.episodes.append(self.episode)
        self.episode.faults.append(fault)

    def _on_restart(self, event: dict[str, Any], node: int) -> None:
        what = event.get("what")
        if what == "workers":
            self.restarts[node] += 1
        elif what == "rank":
            self.relaunches += 1
        if self.episode is not None and what in ("workers", "rank") and self.episode.restart != "workers":
            self.episode.restart = what

    # ------------------------------------------------------------------ scheduler
    def _on_cooldown(self, event: dict[str, Any], node: int) -> None:
        if event.get("rank") is not None and float(event.get("seconds") or 0) > 0:
            self.cooldowns.append((int(event["rank"]), event["ts"], float(event["until"])))

    def _on_straggler(self, event: dict[str, Any], node: int) -> None:
        self.stragglers.append((int(event["rank"]), event["ts"]))

    def _on_generation(self, event: dict[str, Any], node: int) -> None:
        mark = GenerationMark(event["ts"], int(event["generation"]))
        self.generations.append(mark)
        if self.episode is not None and self.episode.generation_at is None:
            self.episode.generation_at, self.episode.generation = mark.ts, mark.generation

    def _on_membership(self, event: dict[str, Any], node: int) -> None:
        if event.get("retired"):
            return  # a rank retired for good: the survivors' degraded stretch goes on
        self._close_degraded(event["ts"])
        world = int(event.get("world") or 0)
        self.worker_num = self.worker_num or world
        if world < self.worker_num:
            self.shrunk = event

    def _close_degraded(self, at: float) -> None:
        if self.shrunk is not None:
            self.degraded.append(DegradedSpan(
                self.shrunk["ts"], at, int(self.shrunk["generation"]),
                tuple(int(r) for r in self.shrunk.get("active") or ()), self.worker_num or 0))
            self.shrunk = None

    # ------------------------------------------------------------------ workers
    def _on_step(self, event: dict[str, Any], node: int) -> None:
        rank, global_step = int(event["rank"]), int(event["step"])
        self.steps[rank].append(StepPoint(event["ts"], global_step, self.current.get(rank, 0)))
        self.high = global_step if self.high is None else max(self.high, global_step)
        episode = self.episode
        if episode is not None and episode.rollback is None and event.get("why") != RESTORED:
            # A survivor's "paused" step may be written just after the fault event: the
            # step the job reached counts it, however the two writers' times interleave.
            episode.reached = (global_step if episode.reached is None
                               else max(episode.reached, global_step))
        if event.get("total") is not None:
            self.total = int(event["total"])

    def _on_train_end(self, event: dict[str, Any], node: int) -> None:
        rank = int(event["rank"])
        self.steps[rank].append(StepPoint(event["ts"], int(event["step"]),
                                          self.current.get(rank, 0)))
        if event.get("params_sha256"):
            self.digests[rank] = str(event["params_sha256"])

    def _on_rollback(self, event: dict[str, Any], node: int) -> None:
        if self.episode is not None and self.episode.rollback is None:
            self.episode.rollback = event

    def _on_recovered(self, event: dict[str, Any], node: int) -> None:
        episode = self.episode
        if episode is None:
            return
        self.episode = None
        global_step = _optional_int(event.get("step"))
        seconds = event.get("seconds")
        self.recoveries.append(Recovery(tuple(episode.faults), event["ts"], event.get("source"),
                                        None if seconds is None else float(seconds), global_step,
                                        episode.reached, episode.restart))
        self.high = global_step

    # ------------------------------------------------------------------ assembly
    def _open_incarnations(self) -> list[Incarnation]:
        ending = IncarnationEnding.RUNNING if self.live else IncarnationEnding.UNKNOWN
        return [Incarnation(rank, int(spawn.get("incarnation") or 0), pid, spawn["ts"],
                            self.end, ending) for (rank, pid), spawn in self.running.items()]

    def _phases(self, incarnations: list[Incarnation]) -> list[PhaseSpan]:
        spans = []
        for rank, start, until in self.cooldowns:
            later = [ts for ts in self.spawns[rank] if ts >= start]
            end = min([until, self.end, *later])
            if end > start:
                spans.append(PhaseSpan(rank, SpanPhase.COOLDOWN, start, end))
        for rank, start in self.stragglers:
            end = min((life.end for life in incarnations
                       if life.rank == rank and life.start <= start < life.end), default=self.end)
            if end > start:
                spans.append(PhaseSpan(rank, SpanPhase.STRAGGLING, start, end))
        for episode in self.episodes:
            if episode.formed_before is None:
                continue  # a job without generations (a plain script): nothing re-forms
            formed = episode.generation_at if episode.generation_at is not None else self.end
            done = next((r.end for r in self.recoveries if r.faults[0] is episode.faults[0]), None)
            resynced = (episode.rollback["ts"] if episode.rollback is not None
                        else done if done is not None else self.end)
            target = episode.generation if episode.generation is not None else episode.formed_before + 1
            windows = [(SpanPhase.REFORMING, episode.faults[0].ts, formed, target)]
            if episode.generation_at is not None:
                windows.append((SpanPhase.RESYNCING, formed, resynced, episode.generation))
            for phase, start, end, generation in windows:
                for life in incarnations:
                    lo, hi = max(start, life.start), min(end, life.end)
                    if hi > lo:
                        spans.append(PhaseSpan(life.rank, phase, lo, hi, generation))
        return spans

    def timeline(self) -> Timeline:
        incarnations = sorted(self.incarnations + self._open_incarnations(),
                              key=lambda i: (i.rank, i.start))
        if self.episode is not None:
            episode = self.episode
            self.recoveries.append(Recovery(tuple(episode.faults), None, reached=episode.reached,
                                            restart=episode.restart))
        self._close_degraded(self.end)
        ends = list(self.node_ends.values())
        ended = bool(ends) and set(self.node_ends) >= self.node_starts
        exitcode = max((int(e.get("exitcode") or 0) for e in ends), default=None)
        reason = "; ".join(sorted({str(e.get("reason", "")) for e in ends})) if ends else ""
        start = self.start if self.start is not None else min(
            (i.start for i in incarnations), default=self.end)
        return Timeline(
            run_id=self.run_id, start=start, end=self.end, ended=ended, running=self.live, exitcode=exitcode,
            reason=reason, lanes=tuple(sorted(self.lanes)), incarnations=tuple(incarnations),
            faults=tuple(self.faults), phases=tuple(self._phases(incarnations)),
            generations=tuple(self.generations), recoveries=tuple(self.recoveries),
            steps={rank: tuple(points) for rank, points in sorted(self.steps.items())},
            total_steps=self.total, digests=dict(sorted(self.digests.items())),
            restarts=max(self.restarts.values(), default=0), relaunches=self.relaunches,
            degraded=tuple(self.degraded))


def build_timeline(events: Iterable[dict[str, Any]], now: float | None = None) -> Timeline:
    """The timeline of ``events`` (any order; ``node_rank`` defaults to 0). ``now``: the job is still
    running and the timeline ends now; None: it ends at the last event. Ill-typed events are left out and
    counted."""
    given = list(events)
    typed = [event for event in given if well_typed(event)]
    ordered = sorted(filter(drawable, typed), key=lambda e: e["ts"])
    last = ordered[-1]["ts"] if ordered else 0.0
    builder = _Builder(end=max(last, now) if now is not None else last, live=now is not None)
    for event in ordered:
        builder.feed(event)
    return replace(builder.timeline(), left_out=len(given) - len(typed))
