"""Inline SVG drawings of a :class:`~launcher.report.timeline.Timeline`: the lanes, and the steps over time.
No script (tooltips are SVG ``<title>`` elements); elements carry classes and ``data-`` attributes that tests
and users' tools find them by."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from html import escape

from launcher.report.model import IncarnationEnding, Recovery, SpanPhase, StepPoint, Timeline

__all__ = ["timeline_svg", "steps_svg", "escape_text", "ENDING_COLOURS", "PHASE_COLOURS", "WIDTH"]

WIDTH = 1160
LEFT, RIGHT = 130, 30
LANE, BAR = 28, 16
AXIS, RECOVERY_ROW, NODE_ROW, LEGEND = 30, 40, 22, 46
STEPS_HEIGHT = 260
"""Pixels: the height of the steps drawing."""
ENDING_COLOURS = {
    IncarnationEnding.SUCCEEDED: "#43a047", IncarnationEnding.FAILED: "#e53935",
    IncarnationEnding.HUNG: "#fb8c00", IncarnationEnding.STOPPED: "#90a4ae",
    IncarnationEnding.RUNNING: "#1e88e5", IncarnationEnding.UNKNOWN: "#bdbdbd",
}
PHASE_COLOURS = {SpanPhase.COOLDOWN: "#fdd835", SpanPhase.REFORMING: "#8e24aa",
                 SpanPhase.RESYNCING: "#00acc1", SpanPhase.STRAGGLING: "#ff7043"}
FAULT_COLOUR = "#b71c1c"
_ROUND_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                43200, 86400)
"""Seconds between two ticks of the time axis, as a person would count them."""
RANK_COLOURS = ("#1e88e5", "#43a047", "#fb8c00", "#8e24aa", "#00acc1", "#6d4c41", "#d81b60",
                "#3949ab", "#7cb342", "#546e7a")


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
"""Characters XML 1.0 does not allow: an SVG holding one would not parse."""


def escape_text(value: object) -> str:
    """``value`` as text safe in an element or an attribute of the page and its SVG."""
    return escape(_NOT_XML.sub("\N{REPLACEMENT CHARACTER}", str(value)), quote=True)


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 100 else f"{value:.0f} s"


@dataclass(frozen=True)
class _Scale:
    """Unix seconds to x pixels over the timeline's span."""

    start: float
    end: float

    def x(self, ts: float) -> float:
        span = max(self.end - self.start, 1e-6)
        return LEFT + (min(max(ts, self.start), self.end) - self.start) / span * (WIDTH - LEFT - RIGHT)

    def ticks(self) -> Iterator[tuple[float, str]]:
        """About ten round ticks, as (unix seconds, label such as ``30s``, ``5m``, ``2h``)."""
        span = max(self.end - self.start, 1e-6)
        raw = span / 10
        if raw < 1:
            power = 10 ** math.floor(math.log10(raw))
            step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
        else:
            step = next((s for s in _ROUND_STEPS if s >= raw), math.ceil(raw / 86400) * 86400)
        for index in range(int(span / step + 1e-9) + 1):
            value = index * step
            yield self.start + value, _since(value, step)


def _since(value: float, step: float) -> str:
    if step >= 3600:
        return f"{value / 3600:g}h"
    if step >= 60:
        return f"{value / 60:g}m"
    return f"{value:g}s"


def _axis(scale: _Scale, top: float, bottom: float, label_y: float) -> list[str]:
    parts = []
    for ts, label in scale.ticks():
        x = scale.x(ts)
        parts.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" '
                     f'stroke="#eceff1"/>')
        parts.append(f'<text x="{x:.1f}" y="{label_y:.1f}" font-size="11" fill="#546e7a" '
                     f'text-anchor="middle">{label}</text>')
    return parts


def _step_path(points: Sequence[StepPoint], scale: _Scale, y: Callable[[float], float]) -> str:
    """Straight lines while the step goes up; a rollback holds the step until it drops."""
    coords: list[tuple[float, float]] = []
    for before, point in zip([None, *points], points):
        if before is not None and point.global_step < before.global_step:
            coords.append((scale.x(point.ts), y(before.global_step)))
        coords.append((scale.x(point.ts), y(point.global_step)))
    return " ".join(f"{x:.1f},{v:.1f}" for x, v in coords)


def _recovery_label(recovery: Recovery, running: bool) -> str:
    if recovery.end is None:
        said = "recovering" if running else "no recovered event"
        return said + (f" (tftrun restarted: {recovery.restart})" if recovery.restart else "")
    seconds = recovery.seconds if recovery.seconds is not None else recovery.end - recovery.start
    where = f" → step {recovery.global_step}" if recovery.global_step is not None else ""
    return f"{recovery.source or 'recovered'}{where} · {_seconds(seconds)}"


def _recoveries(timeline: Timeline, scale: _Scale, top: float) -> Iterator[str]:
    for index, recovery in enumerate(timeline.recoveries):
        x0 = scale.x(recovery.start)
        x1 = scale.x(recovery.end if recovery.end is not None else timeline.end)
        y = top + 26
        causes = ", ".join(f"rank {f.rank} {f.cause}" for f in recovery.faults)
        label = _recovery_label(recovery, timeline.running)
        yield (
            f'<g class="recovery" data-index="{index}" data-source="{escape_text(recovery.source or "")}">'
            f'<title>{escape_text(causes)}: {escape_text(label)}</title>'
            f'<path d="M{x0:.1f},{y - 6:.1f} V{y:.1f} H{x1:.1f} V{y - 6:.1f}" fill="none" '
            f'stroke="#37474f" stroke-width="1.5"/>'
            f'<text x="{(x0 + x1) / 2:.1f}" y="{y - 10:.1f}" font-size="12" fill="#263238" '
            f'text-anchor="middle" font-weight="600">{escape_text(label)}</text></g>')


def _lane_rows(timeline: Timeline, top: float) -> tuple[dict[int, float], list[str], float]:
    """Each rank's lane's top y, the lane backgrounds and labels, and the y below them."""
    rows: dict[int, float] = {}
    parts = []
    y = top
    several = len(timeline.nodes) > 1
    for node in timeline.nodes:
        if several:
            parts.append(f'<text x="8" y="{y + 15:.1f}" font-size="12" font-weight="700" '
                         f'fill="#263238">node {node}</text>')
            y += NODE_ROW
        for lane in (lane for lane in timeline.lanes if lane.node == node):
            rows[lane.rank] = y
            shade = "#fafafa" if len(rows) % 2 else "#f1f3f4"
            parts.append(
                f'<g class="lane" data-rank="{lane.rank}" data-node="{lane.node}" '
                f'data-y="{y:.1f}" data-height="{LANE}">'
                f'<rect x="{LEFT}" y="{y:.1f}" width="{WIDTH - LEFT - RIGHT}" height="{LANE}" '
                f'fill="{shade}"/>'
                f'<text x="{LEFT - 10}" y="{y + LANE / 2 + 4:.1f}" font-size="12" '
                f'text-anchor="end" fill="#263238">rank {lane.rank}</text></g>')
            y += LANE
    return rows, parts, y


def _bars(timeline: Timeline, scale: _Scale, rows: dict[int, float]) -> Iterator[str]:
    pad = (LANE - BAR) / 2
    for life in timeline.incarnations:
        if life.rank not in rows:
            continue
        x0, x1 = scale.x(life.start), scale.x(life.end)
        ended = f", {life.exit}" if life.exit else ""
        yield (
            f'<rect class="incarnation" data-rank="{life.rank}" data-ending="{life.ending.value}" '
            f'x="{x0:.1f}" y="{rows[life.rank] + pad:.1f}" width="{max(x1 - x0, 1):.1f}" '
            f'height="{BAR}" rx="3" fill="{ENDING_COLOURS[life.ending]}">'
            f'<title>rank {escape_text(life.rank)} incarnation {escape_text(life.incarnation)} '
            f'(pid {escape_text(life.pid)}): {life.ending.value}{escape_text(ended)}, '
            f'{_seconds(life.end - life.start)}</title></rect>')
    for span in timeline.phases:
        if span.rank not in rows:
            continue
        x0, x1 = scale.x(span.start), scale.x(span.end)
        generation = f" generation {span.generation}" if span.generation is not None else ""
        yield (
            f'<rect class="phase" data-phase="{span.phase.value}" data-rank="{span.rank}" '
            f'x="{x0:.1f}" y="{rows[span.rank] + pad - 2:.1f}" width="{max(x1 - x0, 1):.1f}" '
            f'height="{BAR + 4}" fill="{PHASE_COLOURS[span.phase]}">'
            f'<title>rank {span.rank}: {span.phase.value}{generation}, '
            f'{_seconds(span.end - span.start)}</title></rect>')


def _degraded(timeline: Timeline, scale: _Scale, top: float, bottom: float) -> Iterator[str]:
    """A shaded band over every lane while the job trained with ranks missing."""
    for stretch in timeline.degraded:
        x0, x1 = scale.x(stretch.start), scale.x(stretch.end)
        ranks = ", ".join(map(str, stretch.active))
        yield (
            f'<rect class="degraded" data-generation="{stretch.generation}" x="{x0:.1f}" '
            f'y="{top:.1f}" width="{max(x1 - x0, 1):.1f}" height="{bottom - top:.1f}" '
            f'fill="#fff3e0" fill-opacity="0.6"><title>degraded: ranks {ranks} of '
            f'{stretch.worker_num} trained on (generation {stretch.generation}), '
            f'{_seconds(stretch.end - stretch.start)}</title></rect>')


def _generations(timeline: Timeline, scale: _Scale, top: float, bottom: float) -> Iterator[str]:
    for mark in timeline.generations:
        x = scale.x(mark.ts)
        yield (
            f'<g class="generation" data-generation="{mark.generation}">'
            f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="#37474f" '
            f'stroke-dasharray="4 3"/>'
            f'<text x="{x + 3:.1f}" y="{bottom + 11:.1f}" font-size="11" fill="#37474f">'
            f'generation {mark.generation}</text></g>')


def _faults(timeline: Timeline, scale: _Scale, rows: dict[int, float]) -> Iterator[str]:
    for fault in timeline.faults:
        if fault.rank not in rows:
            continue
        x, y = scale.x(fault.ts), rows[fault.rank]
        yield (
            f'<g class="fault" data-rank="{fault.rank}" data-ts="{fault.ts:.3f}" '
            f'data-cause="{escape_text(fault.cause)}" data-x="{x:.1f}">'
            f'<title>rank {escape_text(fault.rank)} fault: {escape_text(fault.cause)} '
            f'(pid {escape_text(fault.pid)}) at {_seconds(fault.ts - timeline.start)}</title>'
            f'<line x1="{x:.1f}" y1="{y + 1:.1f}" x2="{x:.1f}" y2="{y + LANE - 1:.1f}" '
            f'stroke="{FAULT_COLOUR}" stroke-width="2.5"/>'
            f'<path d="M{x - 6:.1f},{y + 1:.1f} L{x + 6:.1f},{y + 1:.1f} L{x:.1f},{y + 9:.1f} Z" '
            f'fill="{FAULT_COLOUR}"/>'
            f'<text x="{x + 8:.1f}" y="{y + 11:.1f}" font-size="11" font-weight="700" '
            f'fill="{FAULT_COLOUR}">{escape_text(fault.cause)}</text></g>')


def _legend(timeline: Timeline, y: float) -> list[str]:
    """What the colours mean, for the endings and phases this timeline has."""
    endings = {life.ending for life in timeline.incarnations}
    phases = {span.phase for span in timeline.phases}
    items = [(colour, "running" if ending is IncarnationEnding.RUNNING
              else f"ended: {ending.value}")
             for ending, colour in ENDING_COLOURS.items() if ending in endings]
    items += [(colour, phase.value) for phase, colour in PHASE_COLOURS.items() if phase in phases]
    parts, x = [], float(LEFT)
    for colour, text in items:
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="14" height="12" rx="2" '
                     f'fill="{colour}"/><text x="{x + 18:.1f}" y="{y + 10:.1f}" font-size="11" '
                     f'fill="#37474f">{escape_text(text)}</text>')
        x += 26 + 6.2 * len(text)
    parts.append(f'<path d="M{x:.1f},{y:.1f} L{x + 12:.1f},{y:.1f} L{x + 6:.1f},{y + 8:.1f} Z" '
                 f'fill="{FAULT_COLOUR}"/><text x="{x + 18:.1f}" y="{y + 10:.1f}" '
                 f'font-size="11" fill="#37474f">fault</text>')
    return parts


def timeline_svg(timeline: Timeline) -> str:
    """The lanes: one per rank (grouped by node), incarnations, phases, faults, generations
    and, above them, each recovery labelled with its source and seconds."""
    scale = _Scale(timeline.start, timeline.end)
    lanes_top = AXIS + RECOVERY_ROW
    rows, lanes, bottom = _lane_rows(timeline, lanes_top)
    height = bottom + LEGEND
    parts = [*_axis(scale, AXIS - 4, bottom, AXIS - 12), *lanes,
             *_degraded(timeline, scale, lanes_top - 4, bottom), *_bars(timeline, scale, rows),
             *_generations(timeline, scale, lanes_top - 4, bottom),
             *_recoveries(timeline, scale, AXIS),
             *_faults(timeline, scale, rows), *_legend(timeline, bottom + 24)]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{WIDTH}" '
            f'height="{height:.0f}" viewBox="0 0 {WIDTH} {height:.0f}" font-family="sans-serif">'
            + "".join(parts) + "</svg>")


def steps_svg(timeline: Timeline) -> str:
    """Each rank's step over time; a rollback shows as its line stepping back, labelled
    with the steps redone."""
    scale = _Scale(timeline.start, timeline.end)
    top, bottom = 16, STEPS_HEIGHT - 44
    highest = max([timeline.total_steps or 0,
                   *(p.global_step for points in timeline.steps.values() for p in points)]) or 1

    def y(global_step: float) -> float:
        return bottom - global_step / highest * (bottom - top)

    parts = _axis(scale, top, bottom, bottom + 15)
    for value in (0, highest / 2, highest):
        parts.append(f'<text x="{LEFT - 8}" y="{y(value) + 4:.1f}" font-size="11" '
                     f'text-anchor="end" fill="#546e7a">{value:.0f}</text>')
    parts.append(f'<line x1="{LEFT}" y1="{bottom}" x2="{WIDTH - RIGHT}" y2="{bottom}" '
                 f'stroke="#90a4ae"/>')
    if timeline.total_steps:
        parts.append(f'<line class="total" x1="{LEFT}" y1="{y(timeline.total_steps):.1f}" '
                     f'x2="{WIDTH - RIGHT}" y2="{y(timeline.total_steps):.1f}" stroke="#90a4ae" '
                     f'stroke-dasharray="6 4"/><text x="{LEFT + 4}" '
                     f'y="{y(timeline.total_steps) - 4:.1f}" font-size="11" fill="#546e7a">'
                     f'total {timeline.total_steps}</text>')
    for index, (rank, points) in enumerate(timeline.steps.items()):
        colour = RANK_COLOURS[index % len(RANK_COLOURS)]
        for incarnation in sorted({p.incarnation for p in points}):
            mine = [p for p in points if p.incarnation == incarnation]
            parts.append(f'<polyline class="steps" data-rank="{rank}" '
                         f'data-incarnation="{incarnation}" points="{_step_path(mine, scale, y)}" '
                         f'fill="none" stroke="{colour}" stroke-width="2" '
                         f'stroke-linejoin="round"><title>rank {rank} incarnation {incarnation}'
                         f'</title></polyline>')
        parts.append(f'<text x="{WIDTH - RIGHT - 60 - 60 * (index % 8):.1f}" '
                     f'y="{STEPS_HEIGHT - 8}" font-size="11" fill="{colour}">rank {rank}</text>')
    for recovery in timeline.recoveries:
        redone = recovery.steps_redone
        if recovery.end is None or recovery.global_step is None or not redone:
            continue
        x = scale.x(recovery.end)
        parts.append(f'<g class="redone" data-steps="{redone}"><line x1="{x:.1f}" '
                     f'y1="{y(recovery.global_step + redone):.1f}" x2="{x:.1f}" '
                     f'y2="{y(recovery.global_step):.1f}" '
                     f'stroke="{FAULT_COLOUR}" stroke-width="3"/><text x="{x + 6:.1f}" '
                     f'y="{y(recovery.global_step) + 14:.1f}" font-size="11" font-weight="700" '
                     f'fill="{FAULT_COLOUR}">{redone} steps redone</text></g>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="steps-chart" width="{WIDTH}" '
            f'height="{STEPS_HEIGHT}" viewBox="0 0 {WIDTH} {STEPS_HEIGHT}" font-family="sans-serif">'
            + "".join(parts) + "</svg>")
