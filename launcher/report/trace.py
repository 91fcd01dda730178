"""The timeline as Chrome trace-event JSON, which Perfetto and ``chrome://tracing`` open: one process per node,
one thread per rank, times in microseconds since the job's start (its unix start time is in ``otherData``);
recoveries and degraded stretches go on a ``recoveries`` thread of node 0."""

from __future__ import annotations

from typing import Any

from launcher.report.model import SpanPhase, Timeline

__all__ = ["trace_events", "RECOVERIES_TID"]

RECOVERIES_TID = 1 << 20
"""The thread of the recovery spans (after every rank's)."""


def trace_events(timeline: Timeline) -> dict[str, Any]:
    """The JSON object of the trace (``{"traceEvents": [...], ...}``)."""

    def us(ts: float) -> int:
        return round((ts - timeline.start) * 1e6)

    def span(name: str, category: str, node: int, tid: int, start: float, end: float,
             **args: Any) -> dict[str, Any]:
        return {"name": name, "cat": category, "ph": "X", "pid": node, "tid": tid,
                "ts": us(start), "dur": us(end) - us(start), "args": args}

    events: list[dict[str, Any]] = []
    for node in timeline.nodes or [0]:
        events.append({"name": "process_name", "ph": "M", "pid": node, "tid": 0,
                       "args": {"name": f"node {node}"}})
    for lane in timeline.lanes:
        events.append({"name": "thread_name", "ph": "M", "pid": lane.node, "tid": lane.rank,
                       "args": {"name": f"rank {lane.rank}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": lane.node,
                       "tid": lane.rank, "args": {"sort_index": lane.rank}})
    events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": RECOVERIES_TID,
                   "args": {"name": "recoveries"}})
    for life in timeline.incarnations:
        events.append(span(f"incarnation {life.incarnation} (pid {life.pid})", "incarnation",
                           timeline.node_of(life.rank), life.rank, life.start, life.end,
                           ending=life.ending.value, exit=life.exit, pid=life.pid))
    for phase in timeline.phases:
        name = phase.phase.value + ("" if phase.generation is None
                                    else f" generation {phase.generation}")
        category = "straggler" if phase.phase is SpanPhase.STRAGGLING else "recovery phase"
        events.append(span(name, category, timeline.node_of(phase.rank), phase.rank,
                           phase.start, phase.end))
    for fault in timeline.faults:
        node, tid = ((timeline.node_of(fault.rank), fault.rank) if fault.rank is not None
                     else (0, RECOVERIES_TID))
        events.append({"name": f"fault: {fault.cause}", "cat": "fault", "ph": "i", "s": "t",
                       "pid": node, "tid": tid, "ts": us(fault.ts),
                       "args": {"cause": fault.cause, "pid": fault.pid,
                                "incarnation": fault.incarnation}})
    for mark in timeline.generations:
        events.append({"name": f"generation {mark.generation}", "cat": "generation", "ph": "i",
                       "s": "g", "pid": 0, "tid": RECOVERIES_TID, "ts": us(mark.ts)})
    for recovery in timeline.recoveries:
        end = recovery.end if recovery.end is not None else timeline.end
        label = (f"recovery: {recovery.source}, {recovery.seconds} s" if recovery.end is not None
                 else "recovering" if timeline.running else "no recovered event")
        events.append(span(label, "recovery", 0, RECOVERIES_TID, recovery.start, end,
                           source=recovery.source, seconds=recovery.seconds,
                           step=recovery.global_step, steps_redone=recovery.steps_redone,
                           faults=[f"rank {f.rank}: {f.cause}" for f in recovery.faults]))
    for stretch in timeline.degraded:
        events.append(span(f"degraded: {len(stretch.active)} of {stretch.worker_num} ranks",
                           "degraded", 0, RECOVERIES_TID, stretch.start, stretch.end,
                           generation=stretch.generation, active=list(stretch.active)))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"run_id": timeline.run_id, "start_unix_s": timeline.start}}
