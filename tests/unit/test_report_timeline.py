"""The report's timeline model (launcher/report/timeline.py) and its renderings, on
synthetic event sequences shaped like a real job's: ranks on one or two nodes, kills one
after another, each followed by a cooldown, a relaunch, a new generation and a rollback.
The real job's events are in tests/integration/test_report.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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
    assert [(s.start - T0, s.end - T0, s.active) for s in build_timeline(events).degraded] \
        == [(2.0, 12.0, (0, 2))]
