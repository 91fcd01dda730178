"""The report's timeline model (launcher/report/timeline.py) and its renderings, on
synthetic event sequences shaped like a real job's: ranks on one or two nodes, kills one
after another, each followed by a cooldown, a relaunch, a new generation and a rollback.
The real job's events are in tests/integration/test_report.py."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli import tftctl as ctl
from launcher.report.model import IncarnationEnding, SpanPhase
from launcher.report.page import render_html
from launcher.report.sources import read_job
from launcher.report.timeline import build_timeline
from launcher.report.trace import trace_events
from support.report import SvgElements, check_trace

T0 = 1_800_000_000.0


@dataclass(frozen=True)
class Kill:
    rank: int
    at_step: int
    rollback_to: int


@st.composite
def jobs(draw: st.DrawFn) -> tuple[int, int, list[Kill]]:
    nodes = draw(st.integers(1, 2))
    per_node = draw(st.integers(1, 3))
    kills = draw(st.lists(st.tuples(st.integers(0, nodes * per_node - 1), st.integers(1, 20),
                                    st.integers(0, 20)), max_size=3))
    return nodes, per_node, [Kill(rank, step, min(back, step)) for rank, step, back in kills]


def job_events(nodes: int, per_node: int, kills: list[Kill]) -> list[dict[str, Any]]:
    """What the supervisors, the scheduler and the workers would write, with node_rank."""
    clock = iter(T0 + i * 0.5 for i in range(10_000))
    ranks = range(nodes * per_node)
    pid = iter(range(1000, 9999))
    out: list[dict[str, Any]] = []

    def emit(event: str, node: int = 0, **fields: Any) -> None:
        out.append({"ts": next(clock), "event": event, "node_rank": node, **fields})

    node_of = {rank: rank // per_node for rank in ranks}
    pids = {rank: next(pid) for rank in ranks}
    incarnation = dict.fromkeys(ranks, 0)
    for node in range(nodes):
        emit("job_start", node, run_id="r", pid=1, node_rank=node)
    for rank in ranks:
        emit("spawn", node_of[rank], role="worker", rank=rank, pid=pids[rank], incarnation=0)
    emit("generation", generation=0, world_size=len(ranks))
    generation, step = 0, 0
    for kill in kills:
        step += kill.at_step
        for rank in ranks:
            emit("step", node_of[rank], rank=rank, step=step, total=100, generation=generation)
        node = node_of[kill.rank]
        emit("exit", node, role="worker", rank=kill.rank, pid=pids[kill.rank],
             incarnation=incarnation[kill.rank], expected=False, signal="SIGKILL")
        emit("cooldown", rank=kill.rank, until=out[-1]["ts"] + 1.0, seconds=1.0)
        emit("fault", node, rank=kill.rank, pid=pids[kill.rank],
             incarnation=incarnation[kill.rank], cause="SIGKILL")
        emit("restart", node, what="rank", ranks=[kill.rank])
        pids[kill.rank], incarnation[kill.rank] = next(pid), incarnation[kill.rank] + 1
        emit("spawn", node, role="worker", rank=kill.rank, pid=pids[kill.rank],
             incarnation=incarnation[kill.rank])
        generation += 1
        emit("generation", generation=generation, world_size=len(ranks))
        step -= kill.rollback_to
        emit("rollback", step=step, source="checkpoint", generation=generation)
        emit("recovered", step=step, source="checkpoint", generation=generation, seconds=2.5)
    for rank in ranks:
        emit("train_end", node_of[rank], rank=rank, step=step + 5, params_sha256="ab")
    for rank in ranks:
        emit("exit", node_of[rank], role="worker", rank=rank, pid=pids[rank],
             incarnation=incarnation[rank], expected=False, exitcode=0)
    for node in range(nodes):
        emit("job_end", node, exitcode=0, reason="all workers succeeded", restarts=0)
    return out


@given(jobs())
@settings(max_examples=60, deadline=None)
def test_the_timeline_of_a_finished_job(job: tuple[int, int, list[Kill]]) -> None:
    nodes, per_node, kills = job
    timeline = build_timeline(job_events(nodes, per_node, kills))
    assert [(lane.node, lane.rank) for lane in timeline.lanes] == [
        (rank // per_node, rank) for rank in range(nodes * per_node)]
    assert timeline.ended and timeline.exitcode == 0 and not timeline.running
    for rank in range(nodes * per_node):
        lives = [life for life in timeline.incarnations if life.rank == rank]
        killed = sum(kill.rank == rank for kill in kills)
        assert [life.ending for life in lives] == ([IncarnationEnding.FAILED] * killed
                                                   + [IncarnationEnding.SUCCEEDED])
    assert [f.rank for f in timeline.faults] == [kill.rank for kill in kills]
    assert [r.steps_redone for r in timeline.recoveries] == [k.rollback_to for k in kills]
    assert timeline.relaunches == len(kills) and timeline.digests_agree
    for span in timeline.phases:
        if span.phase is SpanPhase.COOLDOWN:
            continue
        assert any(life.rank == span.rank and life.start <= span.start <= span.end <= life.end
                   for life in timeline.incarnations), span
    assert sum(span.phase is SpanPhase.COOLDOWN for span in timeline.phases) == len(kills)


@given(jobs(), st.data())
@settings(max_examples=60, deadline=None)
def test_a_running_job_draws_what_is_known(job: tuple[int, int, list[Kill]],
                                           data: st.DataObject) -> None:
    """Any prefix of the events (a job still running) renders: a lane per rank spawned, a
    marker per fault, processes without an exit running until now, a valid trace."""
    events = job_events(*job)
    known = events[:data.draw(st.integers(1, len(events)))]
    now = known[-1]["ts"] + 3.0
    timeline = build_timeline(known, now)
    assert timeline.end == now and timeline.running
    spawned = {e["rank"] for e in known if e["event"] == "spawn"}
    svg = SvgElements(render_html(timeline, ["logs"]))
    assert {int(lane["data-rank"]) for lane in svg.of("lane")} == spawned
    assert len(svg.of("fault")) == sum(e["event"] == "fault" for e in known)
    assert all(life.end == now for life in timeline.incarnations
               if life.ending is IncarnationEnding.RUNNING)
    trace = json.loads(json.dumps(trace_events(timeline)))
    check_trace(trace)
    nodes = {e["pid"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert nodes == {lane.node for lane in timeline.lanes} or not timeline.lanes


def test_each_node_dir_gives_its_events_its_node(tmp_path: Path) -> None:
    """Events without node_rank (a node's workers) take the node of the dir they are in."""
    events = job_events(2, 1, [Kill(1, 5, 2)])
    for node in (0, 1):
        folder = tmp_path / f"node{node}"
        folder.mkdir()
        lines = [{k: v for k, v in e.items() if k != "node_rank" or e["event"] == "job_start"}
                 for e in events if e["node_rank"] == node]
        (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    timeline = build_timeline(read_job([tmp_path / "node0", tmp_path / "node1"]))
    assert [(lane.node, lane.rank) for lane in timeline.lanes] == [(0, 0), (1, 1)]
    assert timeline.faults[0].rank == 1 and timeline.node_of(1) == 1


def test_a_survivors_paused_step_written_just_after_the_fault_counts_as_reached() -> None:
    """The supervisor writes the fault as soon as it reaps the killed rank; the survivor's
    ``paused`` step may land a moment later. The steps redone are still counted from it
    (seen in CI: 0 steps redone drawn for a rollback from step 25 to 20)."""
    events = [
        {"ts": T0, "event": "job_start", "run_id": "r", "pid": 1},
        {"ts": T0 + 0.1, "event": "spawn", "role": "worker", "rank": 0, "pid": 10, "incarnation": 0},
        {"ts": T0 + 0.1, "event": "spawn", "role": "worker", "rank": 1, "pid": 11, "incarnation": 0},
        {"ts": T0 + 0.2, "event": "generation", "generation": 0, "world_size": 2},
        {"ts": T0 + 1.0, "event": "step", "rank": 0, "step": 1, "total": 40, "generation": 0, "why": "interval"},
        {"ts": T0 + 2.0, "event": "exit", "role": "worker", "rank": 1, "pid": 11, "incarnation": 0,
         "expected": False, "signal": "SIGKILL"},
        {"ts": T0 + 2.0001, "event": "fault", "rank": 1, "pid": 11, "incarnation": 0, "cause": "SIGKILL"},
        {"ts": T0 + 2.0002, "event": "step", "rank": 0, "step": 25, "total": 40, "generation": 0, "why": "paused"},
        {"ts": T0 + 3.0, "event": "generation", "generation": 1, "world_size": 2},
        {"ts": T0 + 4.0, "event": "step", "rank": 0, "step": 20, "total": 40, "generation": 1, "why": "restored"},
        {"ts": T0 + 4.0, "event": "rollback", "step": 20, "source": "checkpoint", "generation": 1},
        {"ts": T0 + 4.0, "event": "recovered", "step": 20, "source": "checkpoint", "generation": 1, "seconds": 2.0},
    ]
    [recovery] = build_timeline(events).recoveries
    assert recovery.steps_redone == 5


def test_a_stretch_trained_with_ranks_missing_is_a_degraded_span_in_every_view() -> None:
    """``--min_worker_num``: rank 1 dies, ranks 0 and 2 train on (generation 1) until it is
    back (generation 2)."""
    events = [
        {"ts": T0, "event": "job_start", "run_id": "r", "pid": 1},
        *({"ts": T0 + 0.1, "event": "spawn", "role": "worker", "rank": r, "pid": 10 + r,
           "incarnation": 0} for r in range(3)),
        {"ts": T0 + 0.2, "event": "membership", "active": [0, 1, 2], "world": 3,
         "generation": 0, "why": "start"},
        {"ts": T0 + 2.0, "event": "membership", "active": [0, 2], "world": 2,
         "generation": 1, "why": "shrink"},
        {"ts": T0 + 9.0, "event": "membership", "active": [0, 1, 2], "world": 3,
         "generation": 2, "why": "grow"},
        {"ts": T0 + 10.0, "event": "membership", "active": [0, 1], "world": 2,
         "generation": 3, "why": "shrink"},
        {"ts": T0 + 12.0, "event": "job_end", "exitcode": 0, "reason": "done"},
    ]
    timeline = build_timeline(events)
    assert [(s.start - T0, s.end - T0, s.active, s.worker_num) for s in timeline.degraded] \
        == [(2.0, 9.0, (0, 2), 3), (10.0, 12.0, (0, 1), 3)]
    trace = [e for e in trace_events(timeline)["traceEvents"] if e.get("cat") == "degraded"]
    assert [(e["name"], e["dur"]) for e in trace] == [("degraded: 2 of 3 ranks", 7_000_000),
                                                      ("degraded: 2 of 3 ranks", 2_000_000)]
    page = render_html(timeline, ["logs"])
    assert page.count('class="degraded"') == 2 and "degraded: ranks 0, 2 of 3" in page


def test_a_retirement_goes_on_with_the_degraded_span() -> None:
    """Rank 1 is retired for good (``--rejoin_timeout``) while ranks 0 and 2 train on in
    generation 1: the supervisor's ``membership`` event with ``retired`` (from another
    node without a generation) neither ends the degraded stretch nor starts another."""
    events = [
        {"ts": T0, "event": "job_start", "run_id": "r", "pid": 1},
        {"ts": T0 + 0.2, "event": "membership", "active": [0, 1, 2], "world": 3,
         "generation": 0, "why": "start"},
        {"ts": T0 + 2.0, "event": "membership", "active": [0, 2], "world": 2,
         "generation": 1, "why": "shrink"},
        {"ts": T0 + 8.0, "event": "membership", "active": [0, 2], "world": 2,
         "generation": None, "why": "shrink", "lost": [], "joined": [], "retired": [1]},
        {"ts": T0 + 12.0, "event": "job_end", "exitcode": 0, "reason": "done"},
    ]
    timeline = build_timeline(events)
    assert [(s.start - T0, s.end - T0, s.active) for s in timeline.degraded] == [(2.0, 12.0, (0, 2))]
    assert timeline.left_out == 0  # a generation of None: nothing to draw, not a wrong type


MARKUP = "<script>alert(1)</script><img src=x onerror=alert(1)>\"'&</title>"
PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "div", "p", "code",
             "span", "table", "tr", "th", "td", "svg", "g", "line", "text", "rect", "path",
             "polyline"}
"""Every element the report itself writes."""
TEXT_FIELDS = ("run_id", "role", "signal", "cause", "what", "why", "params_sha256", "source",
               "reason")


def tampered_job() -> list[dict[str, Any]]:
    """A job with a kill, followed by copies of each of its events with one field (any but
    ``event``) set to markup, by copies with every text field set to markup, and by texts
    with control characters and lone surrogates (neither XML nor UTF-8 can hold them)."""
    events = job_events(2, 1, [Kill(1, 5, 2)])
    out = list(events)
    for event in events:
        out += [{**event, name: MARKUP} for name in event if name != "event"]
        out.append({**event, **{name: MARKUP for name in TEXT_FIELDS if name in event}})
    out.append({**events[0], "event": MARKUP})
    out += [{**event, "cause": "\x1b[31m\ud800\x00" + MARKUP, "reason": "\udfff\x07"}
            for event in events if event["event"] in ("fault", "job_end")]
    return out


def report_of(tmp_path: Path, lines: list[str]) -> tuple[str, dict[str, Any]]:
    """``tftctl report``'s HTML page and trace of an ``events.jsonl`` of ``lines``."""
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "events.jsonl").write_text("".join(line + "\n" for line in lines))
    page, trace = tmp_path / "report.html", tmp_path / "trace.json"
    assert ctl.main(["report", "--log_dir", str(logs), "-o", str(page)]) == 0
    assert ctl.main(["report", "--log_dir", str(logs), "--format", "trace", "-o", str(trace)]) == 0

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the trace: not JSON")

    return page.read_text(), json.loads(trace.read_text(), parse_constant=refuse)


def assert_no_markup_survives(page: str) -> None:
    elements = SvgElements(page)
    assert elements.tags <= PAGE_TAGS, elements.tags - PAGE_TAGS
    assert not [name for _, attrs in elements.found for name in attrs if name.startswith("on")]
    drawings = re.findall(r"<svg .*?</svg>", page, re.DOTALL)
    assert len(drawings) == 2
    for drawing in drawings:
        tags = {element.tag.split("}")[-1] for element in ElementTree.fromstring(drawing).iter()}
        assert tags <= PAGE_TAGS, tags


def test_markup_in_any_field_of_the_events_leaves_no_tag_in_the_report(tmp_path: Path) -> None:
    """A log dir may be shared or archived and its report opened by others: markup in a
    field of ``events.jsonl`` is text in the page (escaped) or, in a field that holds a
    number, leaves its event out; the trace stays JSON."""
    page, trace = report_of(tmp_path, [json.dumps(e) for e in tampered_job()])
    assert_no_markup_survives(page)
    check_trace(trace)
    assert "rank 1 fault: SIGKILL" in page  # the untampered job is drawn


def test_a_number_that_is_not_one_is_not_drawn(tmp_path: Path) -> None:
    """A pid, rank or time that is markup, a string, a boolean, NaN or infinite leaves its
    event out: it is never printed, and the rest of the job is drawn."""
    events = job_events(2, 1, [Kill(1, 5, 2)])
    numbers = ("pid", "rank", "incarnation", "step", "generation", "ts", "seconds", "until")
    bad = [MARKUP, "7", True, [1], {"x": 1}]
    lines = [json.dumps(e) for e in events]
    for event in events:
        for name in (n for n in numbers if n in event):
            lines += [json.dumps({**event, name: value}) for value in bad]
            lines += [json.dumps({**event, name: value}) for value in (math.nan, math.inf, 1e300)]
    not_objects = ["[1, 2]", '"text"', "null"]
    page, trace = report_of(tmp_path, lines + not_objects)
    assert "alert" not in page and "alert" not in json.dumps(trace)
    assert_no_markup_survives(page)
    check_trace(trace)
    drawn = build_timeline(read_job([tmp_path / "logs"]))
    assert drawn.left_out == len(lines) - len(events)
    assert replace(drawn, left_out=0) == build_timeline(events)
    assert f"{drawn.left_out} events left out" in page


FIELDS_READ = ("event", "ts", "node_rank", "run_id", "pid", "role", "rank", "incarnation",
               "expected", "exitcode", "signal", "cause", "what", "seconds", "until",
               "generation", "world", "retired", "active", "step", "why", "total",
               "params_sha256", "source", "reason")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats()
    | st.text() | st.sampled_from([MARKUP, "spawn", "exit", "fault", "worker"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


@given(st.lists(st.tuples(st.integers(0, 30), st.sampled_from(FIELDS_READ), json_values),
                max_size=8))
@settings(max_examples=150, deadline=None)
def test_any_value_in_any_field_renders_a_page_without_foreign_tags_and_a_json_trace(
        changes: list[tuple[int, str, Any]]) -> None:
    """Whatever JSON a field of the events holds, the report neither fails nor lets a tag
    through, and its trace is JSON (no ``NaN``)."""
    events = job_events(2, 1, [Kill(1, 5, 2)])
    for index, name, value in changes:
        events[index % len(events)] = {**events[index % len(events)], name: value}
    timeline = build_timeline(events)
    page = render_html(timeline, ["logs"])
    assert_no_markup_survives(page)
    trace = json.loads(json.dumps(trace_events(timeline), allow_nan=False))
    # (A job whose events were removed at random need not nest as check_trace wants.)
    assert all(isinstance(entry["pid"], int) and isinstance(entry["tid"], int)
               and isinstance(entry.get("ts", 0), int) for entry in trace["traceEvents"])
