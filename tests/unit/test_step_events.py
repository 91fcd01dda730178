"""The workers' ``step`` events (recovery/train/step_events.py): rate-limited, but a
pause or a restore is written at once."""

from __future__ import annotations

from pathlib import Path

from recovery.events import EventLog, read_events
from recovery.train.step_events import StepEvents, step_event_interval


def test_steps_are_written_once_an_interval_but_a_pause_at_once(tmp_path: Path) -> None:
    now = [0.0]
    steps = StepEvents(EventLog(tmp_path), rank=3, world_size=4, clock=lambda: now[0])
    steps.total, steps.batch = 50, 96
    for step in range(1, 31):
        steps.completed(step, generation=0)
        now[0] += 0.125  # 8 steps a second: one event every 8 steps
    steps.reached(30, 0, "paused")
    written = [(e["step"], e["why"]) for e in read_events(tmp_path)]
    assert written == [(1, "interval"), (9, "interval"), (17, "interval"), (25, "interval"),
                       (30, "paused")]
    first = next(read_events(tmp_path))
    assert {k: first[k] for k in ("rank", "total", "batch", "generation")} == {
        "rank": 3, "total": 50, "batch": 96, "generation": 0}


def test_a_large_job_writes_about_eight_step_events_a_second() -> None:
    assert step_event_interval(2) == 1.0
    assert step_event_interval(64) * 8 == 64
