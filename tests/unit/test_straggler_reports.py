"""Step times on their way to the scheduler: a supervisor merges a rank's beats into its
node's beat, the scheduler names a straggler (event and status), ``slow`` is checked."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from launcher.cli import tftrun as cli
from launcher.cli.status import format_status
from recovery.control.inject import Injection, check_fault
from recovery.control.node_beats import NodeBeats
from recovery.control.scheduler import Scheduler
from recovery.control.stragglers import StragglerDetector, StragglerSettings
from support import events
from support.sched_inprocess import ask, scheduler


def report(rank: int, **fields: Any) -> dict[str, Any]:
    return {"node_id": str(rank), "pid": 100 + rank, "incarnation": 1, "host": "h",
            "rank": rank, **fields}


def test_a_supervisor_merges_its_ranks_step_times_into_the_next_node_beat_once() -> None:
    beats = NodeBeats(30.0, 6.0)
    beats.heard(0, "register", report(0), 0.0)
    [sent] = beats.beats(0.0)
    beats.fan_out(sent, {"ok": True, "ranks": [{"ok": True, "node_id": "0", "rank": 0,
                                                "generation": 0, "fault_at": None}]})
    beats.heard(0, "heartbeat", report(0, step=4, step_us=900, steps=4), 1.0)
    beats.heard(0, "heartbeat", report(0, step=10, step_us=2000, steps=6), 2.0)
    [[(_key, entry)]] = beats.beats(3.0)
    assert (entry["step"], entry["step_us"], entry["steps"]) == (10, 2000, 10)
    [[(_key, entry)]] = beats.beats(4.0)
    assert "step_us" not in entry and "steps" not in entry  # sent once


def test_the_scheduler_names_a_straggler_once_in_an_event_and_in_its_status(
        tmp_path: Path) -> None:
    sched = scheduler(tmp_path)
    ranks = [{"op": "register", **report(r), "step": None, "phase": None, "age": 0}
             for r in range(2)]
    ask(sched, "node_beat", node="h/0", ranks=ranks)
    for step in (10, 20, 30):
        beat = [{**entry, "op": "heartbeat", "step": step, "age": 0, "steps": 10,
                 "step_us": 3000 if entry["rank"] == 1 and step > 10 else 1000}
                for entry in ranks]
        assert ask(sched, "node_beat", node="h/0", ranks=beat)["ok"]
    [named] = events(tmp_path / "logs", "straggler")
    assert {k: named[k] for k in ("rank", "node", "step_time", "median", "since")} == {
        "rank": 1, "node": "h/0", "step_time": 0.003, "median": 0.001, "since": 11}
    status = ask(sched, "status")
    assert status["stragglers"] == [{"rank": 1, "step_time": 0.003, "median": 0.001,
                                     "since": 11}]
    assert "straggler rank 1 (3.0x its peers' step time since step 11)" in format_status(status)
    # A beat of another process holding rank 1 (a stale one) is not counted.
    stale = {**ranks[1], "op": "heartbeat", "pid": 999, "step": 40, "age": 0, "steps": 10,
             "step_us": 1000}
    ask(sched, "node_beat", node="h/0", ranks=[stale])
    assert ask(sched, "status")["stragglers"] == status["stragglers"]


@pytest.mark.parametrize(("fault", "factor", "problem"), [
    ("slow", None, "--fault slow needs --factor above 1 and at most 1000, got None"),
    ("slow", 1.0, "--fault slow needs --factor above 1 and at most 1000, got 1.0"),
    ("slow", 1001.0, "--fault slow needs --factor above 1 and at most 1000, got 1001.0"),
    ("hang", 2.0, "--factor is for --fault slow only, not hang"),
    ("slow", 3.0, None),
])
def test_a_slow_fault_needs_a_factor_and_only_it_takes_one(
        fault: str, factor: float | None, problem: str | None) -> None:
    assert check_fault(fault, None, factor) == problem


def test_a_slow_injection_keeps_its_factor_through_the_queue_and_others_have_none() -> None:
    slow = Injection("a", 2, "slow", 40, 3.0)
    assert Injection.from_json(slow.to_json()) == slow
    assert "factor" not in Injection("b", 2, "hang", None).to_json()


@pytest.mark.parametrize(("option", "error"), [
    ("--straggler_factor=1", "--straggler_factor must be above 1, got 1"),
    ("--straggler_window=0", "--straggler_window must be at least 1 step, got 0"),
    ("--straggler_policy=kill", "--straggler_policy must be one of report, evict, got 'kill'"),
])
def test_bad_straggler_options_are_one_line_and_exit_2(
        option: str, error: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main([option, f"--log_dir={tmp_path}", "train.py"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"tftrun: error: {error}"]


def test_under_evict_a_straggler_of_a_whole_job_is_judged_lost_and_only_one_at_a_time(
        tmp_path: Path) -> None:
    from torch.distributed import HashStore

    config = replace(scheduler(tmp_path).config, worker_num=3,
                     stragglers=StragglerSettings(window=10, policy="evict"))
    sched = Scheduler(config)
    sched._client = HashStore()
    ranks = [{"op": "register", **report(r), "step": None, "phase": None, "age": 0}
             for r in range(3)]
    ask(sched, "node_beat", node="h/0", ranks=ranks)

    def beat(step: int, slow: int) -> None:
        ask(sched, "node_beat", node="h/0", ranks=[
            {**entry, "op": "heartbeat", "step": step, "age": 0, "steps": 10,
             "step_us": 5000 if entry["rank"] == slow else 1000} for entry in ranks])

    beat(10, slow=2)  # each process's first summary is its warm-up: not counted
    assert events(tmp_path / "logs", "verdict") == []
    beat(20, slow=2)
    [verdict] = events(tmp_path / "logs", "verdict")
    assert (verdict["rank"], verdict["verdict"], verdict["node"]) == (2, "straggler", "h/0")
    assert (verdict["step_time"], verdict["median"]) == (0.005, 0.001)
    assert sched.membership.verdicts() == {2: "heartbeat"}  # its supervisor kills it
    assert [m["state"] for m in ask(sched, "status")["members"]] == ["alive", "alive", "lost"]
    beat(30, slow=1)  # rank 1 slow now, while rank 2 is missing: reported, not evicted
    assert [e["rank"] for e in events(tmp_path / "logs", "straggler")] == [2, 1]
    assert [e["rank"] for e in events(tmp_path / "logs", "verdict")] == [2]


def test_a_new_generation_starts_the_detector_afresh() -> None:
    detector = StragglerDetector(StragglerSettings(window=4))
    detector.heard(0, 4, 1.0, 4)
    detector.heard(1, 4, 3.0, 4)
    assert detector.named
    detector.reset()
    assert (detector.named, detector.latest) == ({}, {})
