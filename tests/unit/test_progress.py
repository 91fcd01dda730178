"""The live view's figures (launcher/view/progress.py, launcher/view/render.py's progress line) from
events as a node's events.jsonl holds them."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from rich.console import Console

from launcher.view.progress import EventTail, Progress, format_eta, progress_bar
from launcher.view.render import LiveView, PlainView, Row, progress_line


def step(ts: float, rank: int, at: int, generation: int = 0,
         why: str = "interval") -> dict[str, object]:
    return {"ts": ts, "event": "step", "rank": rank, "step": at, "total": 100,
            "generation": generation, "why": why}


def test_steps_give_speed_and_eta_and_a_recovery_shows_what_it_is_doing() -> None:
    progress = Progress()
    progress.feed([{"ts": 0.0, "event": "generation", "generation": 0},
                   step(1.0, 0, 10), step(1.0, 1, 10), step(2.0, 0, 30), step(2.0, 1, 30)])
    assert (progress.global_step, progress.rate, progress.total) == (30, 20.0, 100)
    assert progress.eta() == 3.5
    assert progress_bar(progress, width=10) == "[###.......] 30/100 30% 20.0 steps/s ETA 0:04"

    progress.feed([{"ts": 2.5, "event": "fault", "rank": 1, "cause": "SIGKILL"}])
    assert progress.recovering == "re-forming generation 1" and progress.eta() is None
    progress.feed([step(2.6, 0, 31, generation=0, why="paused"),
                   {"ts": 4.0, "event": "generation", "generation": 1}])
    assert progress.recovering == "resynchronising generation 1"
    progress.feed([step(5.0, 0, 20, generation=1, why="restored")])
    assert progress.recovering is None and progress.ranks[0].global_step == 20
    assert progress.ranks[0].rate == 20.0  # neither the pause nor the rollback is a speed
    progress.feed([step(6.0, 0, 30, generation=1)])
    assert progress.ranks[0].rate == 10.0


def test_a_device_fault_or_a_job_without_generations_forms_nothing() -> None:
    progress = Progress()
    progress.feed([{"ts": 1.0, "event": "fault", "rank": 0, "cause": "SIGKILL"}])
    assert progress.recovering is None
    progress.feed([{"ts": 2.0, "event": "generation", "generation": 0},
                   {"ts": 3.0, "event": "fault", "rank": 0, "cause": "uce"}])
    assert progress.recovering is None


def test_the_tail_reads_only_whole_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.read() == []
    path.write_text(json.dumps(step(1.0, 0, 1)) + "\n" + '{"ts": 2.0, "ev')
    assert [e["step"] for e in tail.read()] == [1]
    with open(path, "a") as file:
        file.write('ent": "step", "rank": 0, "step": 2}\n')
    assert [e["step"] for e in tail.read()] == [2]
    assert tail.read() == []


def _append_steps(path: Path, megabytes: int, rank: int = 3) -> None:
    """``megabytes`` of step events of ``rank`` (step 1, 2, ...), as a busy job appends them."""
    lines = [json.dumps(step(1.0, rank, i)) + "\n" for i in range(1, 2001)]
    block = "".join(lines).encode()
    with open(path, "ab") as file:
        for _ in range(megabytes * 1_000_000 // len(block)):
            file.write(block)


def test_a_tail_far_behind_reads_a_bounded_chunk_per_call_and_loses_nothing(
        tmp_path: Path) -> None:
    """A pass of the supervisor's loop must not parse what a busy job appended since the
    last: 300 MB appended mid-run kept the job's end waiting 24-37 s (issue 28)."""
    path = tmp_path / "events.jsonl"
    _append_steps(path, 8)
    path.open("a").write(json.dumps({"ts": 9.0, "event": "register", "node_id": "0"}) + "\n")
    tail = EventTail(path)
    first = tail.read()
    assert 0 < sum(len(json.dumps(e)) + 1 for e in first) <= 1_000_000
    read = len(first)
    while (events := tail.read()):
        read += len(events)
    assert read == path.read_bytes().count(b"\n")


def test_the_view_of_a_file_far_behind_shows_the_newest_events_in_one_cheap_pass(
        tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(step(0.5, 0, 1)) + "\n")
    out = io.StringIO()
    view = PlainView(out, path, progress_interval=0.001)
    view.show_rows([Row(0, 11, "running", 0, "")])
    _append_steps(path, 32, rank=0)
    started = time.monotonic()
    view.show_rows([Row(0, 11, "running", 0, "")])
    assert time.monotonic() - started < 2.0  # all 32 MB parsed: 5-10 s here
    assert "rank 0 step 2000 " in out.getvalue().splitlines()[-1]
    with open(path, "a") as file:
        file.write(json.dumps(step(3.0, 0, 2001)) + "\n")
    view.show_rows([Row(0, 11, "running", 0, "")])
    assert "rank 0 step 2001 " in out.getvalue().splitlines()[-1]


def test_the_plain_progress_line_counts_a_cooldown_down(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in (
        {"ts": 0.0, "event": "generation", "generation": 0}, step(1.0, 0, 10), step(2.0, 0, 20),
        {"ts": 2.5, "event": "fault", "rank": 1, "cause": "SIGKILL"})))
    out = io.StringIO()
    view = PlainView(out, path, progress_interval=0.001)
    rows = [Row(0, 11, "running", 0, ""), Row(1, None, "cooldown 3s", 1, "")]
    view.show_rows(rows)
    line = out.getvalue()
    assert "tftrun: progress [" in line and "20/100" in line
    assert "re-forming generation 1; rank 0 step 20 10.0/s, rank 1 cooldown 3s" in line
    assert progress_line(Progress(), [Row(0, 1, "running", 0, "")]) is None
    assert format_eta(3725) == "ETA 1:02:05"


def test_no_progress_lines_when_the_interval_is_zero(tmp_path: Path) -> None:
    view = PlainView(io.StringIO(), tmp_path / "events.jsonl", progress_interval=0)
    assert not view.wants_rows


def test_the_live_table_shows_steps_and_the_bar_under_it(tmp_path: Path) -> None:
    """The bar is shown as text: rich would take ``[####...]`` for markup and drop it."""
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in (step(1.0, 0, 10), step(2.0, 0, 30))))
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    view = LiveView(console, path)
    view.show_rows([Row(0, 11, "running", 0, "step=30 loss=0.5")])
    view.close()
    shown = console.file.getvalue()
    assert "[#######" in shown and "30/100 30% 20.0 steps/s ETA 0:04" in shown
    assert "│ 30   │ 20.0    │" in shown


def test_with_several_nodes_the_live_table_says_which_node_it_shows(tmp_path: Path) -> None:
    from launcher.config import LaunchConfig

    node_1 = LaunchConfig(script=tmp_path / "train.py", worker_num=8, local_worker_num=4,
                          node_rank=1, master_addr="10.0.0.1", node_addr="10.0.0.2")
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    view = LiveView(console, None, node_1.node_title)
    view.show_rows([Row(4, 11, "running", 0, "step=3")])
    view.close()
    assert "tftrun: node 1 (10.0.0.2), ranks 4-7 of 8" in console.file.getvalue()
    assert LaunchConfig(script=tmp_path / "train.py", worker_num=4).node_title == "tftrun"


def test_while_ranks_are_missing_the_progress_line_says_how_many_train() -> None:
    progress = Progress()
    progress.feed([{"ts": 0.0, "event": "membership", "world": 3, "active": [0, 1, 2],
                    "generation": 0, "why": "start"}, step(1.0, 0, 10), step(2.0, 0, 20)])
    assert progress.degraded is None
    progress.feed([{"ts": 2.5, "event": "membership", "world": 2, "active": [0, 2],
                    "generation": 1, "why": "shrink"}])
    line = progress_line(progress, [Row(0, 11, "running", 0, ""), Row(1, None, "cooldown 3s", 1, "")])
    assert line is not None and "20/100" in line and "; degraded: 2 of 3 ranks;" in line
    progress.feed([{"ts": 9.0, "event": "membership", "world": 3, "active": [0, 1, 2],
                    "generation": 2, "why": "grow"}])
    assert progress.degraded is None


def test_while_ranks_are_missing_the_live_table_shows_w_and_the_samples_per_second(
        tmp_path: Path) -> None:
    """The step events' ``batch`` (samples a step trains, job-wide) times the steps' speed."""
    events = [{"ts": 0.0, "event": "membership", "world": 3, "active": [0, 1, 2],
               "generation": 0, "why": "start"},
              {"ts": 2.5, "event": "membership", "world": 2, "active": [0, 2],
               "generation": 1, "why": "shrink"},
              {**step(3.0, 0, 20, 1), "batch": 96}, {**step(5.0, 0, 30, 1), "batch": 96}]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    view = LiveView(console, path)
    view.show_rows([Row(0, 11, "running", 0, ""), Row(1, None, "cooldown 3s", 1, "")])
    view.close()
    shown = " ".join(console.file.getvalue().split())  # the caption may wrap
    assert "degraded: 2 of 3 ranks, 480 samples/s" in shown  # 5 steps/s x 96 samples
