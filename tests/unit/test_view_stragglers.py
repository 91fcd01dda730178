"""The live view marks a rank named a straggler, until a new process holds the rank."""

from __future__ import annotations

import io

from rich.console import Console

from launcher.view.progress import Progress
from launcher.view.render import LiveView, Row, progress_line


def step(rank: int, at: int, ts: float) -> dict[str, object]:
    return {"ts": ts, "event": "step", "rank": rank, "step": at, "total": 100,
            "generation": 0, "why": "interval"}


def test_a_straggler_is_marked_in_the_progress_line_until_its_rank_is_relaunched() -> None:
    progress = Progress()
    rows = [Row(0, 10, "running", 0, ""), Row(1, 11, "running", 0, "")]
    progress.feed([step(0, 10, 1.0), step(1, 10, 1.0), step(0, 20, 2.0), step(1, 20, 2.0)])
    assert "straggler" not in (progress_line(progress, rows) or "")
    progress.feed([{"ts": 3.0, "event": "straggler", "rank": 1, "node": "h/0",
                    "step_time": 0.03, "median": 0.01, "since": 12}])
    line = progress_line(progress, rows) or ""
    assert "rank 1 step 20 10.0/s straggler" in line and "rank 0 step 20 10.0/s," in line
    progress.feed([{"ts": 4.0, "event": "spawn", "role": "worker", "rank": 1, "pid": 12,
                    "incarnation": 1}])
    assert "straggler" not in (progress_line(progress, rows) or "")


def test_the_live_table_marks_the_stragglers_state() -> None:
    out = io.StringIO()
    view = LiveView(Console(file=out, force_terminal=True, width=200))
    try:
        view._progress.feed([{"ts": 3.0, "event": "straggler", "rank": 1}])
        view.show_rows([Row(0, 10, "running", 0, ""), Row(1, 11, "running", 0, "")])
    finally:
        view.close()
    assert "running (straggler)" in out.getvalue()
