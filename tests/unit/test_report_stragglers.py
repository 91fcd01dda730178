"""A ``straggler`` event in ``tftctl report``: a straggling span on its rank, to the end of
the process it named, in the timeline, the SVG and the trace."""

from __future__ import annotations

from typing import Any

from launcher.report.model import PhaseSpan, SpanPhase
from launcher.report.svg import timeline_svg
from launcher.report.timeline import build_timeline
from launcher.report.trace import trace_events
from support.report import check_trace

T0 = 1_800_000_000.0


def job() -> list[dict[str, Any]]:
    """Two ranks; rank 1 named a straggler at +10 s, its process stopped at +15 s and
    relaunched; the job ends at +30 s."""
    events: list[dict[str, Any]] = [{"ts": T0, "event": "job_start", "run_id": "r"}]
    for rank in (0, 1):
        events.append({"ts": T0 + 0.1, "event": "spawn", "role": "worker", "rank": rank,
                       "pid": 100 + rank, "incarnation": 0})
    events += [
        {"ts": T0 + 10, "event": "straggler", "rank": 1, "node": "h/0", "step_time": 0.03,
         "median": 0.01, "since": 40},
        {"ts": T0 + 15, "event": "exit", "role": "worker", "rank": 1, "pid": 101,
         "expected": True, "outcome": "stopped", "signal": "SIGTERM"},
        {"ts": T0 + 16, "event": "spawn", "role": "worker", "rank": 1, "pid": 102,
         "incarnation": 1},
        {"ts": T0 + 30, "event": "job_end", "exitcode": 0, "reason": "done"},
    ]
    return events


def test_a_straggler_is_a_span_on_its_rank_to_the_end_of_its_process() -> None:
    timeline = build_timeline(job())
    assert [p for p in timeline.phases if p.phase is SpanPhase.STRAGGLING] == [
        PhaseSpan(1, SpanPhase.STRAGGLING, T0 + 10, T0 + 15)]
    assert 'data-phase="straggling" data-rank="1"' in timeline_svg(timeline)
    threads = check_trace(trace_events(timeline))
    [span] = [e for e in threads[(0, 1)] if e["cat"] == "straggler"]
    assert (span["name"], span["ts"], span["dur"]) == ("straggling", 10_000_000, 5_000_000)


def test_a_straggler_event_without_a_rank_is_left_out() -> None:
    events = [*job()[:3], {"ts": T0 + 10, "event": "straggler", "rank": "one"}]
    timeline = build_timeline(events)
    assert timeline.left_out == 1 and not timeline.phases
