"""``tftctl report`` and the progress lines, on the events of a real job with a kill.

One job for the whole module: the main job on 2 ranks, rollback to checkpoints (the
lose-nothing modes off, so that steps are redone), a 1 s rejoin cooldown, a progress
line every 0.5 s; rank 1 is ``kill -9``ed past step 25. The HTML is parsed for its SVG,
the trace checked against the trace-event format, and (when Chromium is installed) the
page is rendered by a real headless browser and its screenshot looked at.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.cli import tftctl as ctl
from launcher.view.logs import archive_previous_run
from support import TFT_OFF, events, free_tcp_port, log_has, spawn, spawned_pids, tftrun_cmd, wait_for
from support.mnist import EVENT, NARROW, TRAIN, wait_job
from support.png import read_png
from support.report import SvgElements, check_trace

pytestmark = pytest.mark.timeout(200)

STEPS = 180
"""Fewer than the epoch's 187 steps (12000 samples, 2 ranks, batches of 32): the total."""
KILL_AFTER = 25
"""The kill lands before the checkpoint of step 40 (so steps are redone), and the 160 steps
after the rollback give the speed and the ETA time to show in the progress lines."""
JOB = (*NARROW, "--epochs", "1", "--max_steps", str(STEPS), "--save_steps", "20",
       "--synthetic_size", "12000", "--log_every", "5")


@dataclass(frozen=True)
class KilledJob:
    log_dir: Path
    output: str
    killed_pid: int


@pytest.fixture(scope="module")
def killed_job(tmp_path_factory: pytest.TempPathFactory) -> KilledJob:
    tmp = tmp_path_factory.mktemp("report_job")
    log_dir = tmp / "logs"
    proc = spawn(tftrun_cmd("--worker_num=2", f"--log_dir={log_dir}",
                            f"--recovery_path={tmp / 'recovery'}",
                            f"--master_port={free_tcp_port()}", "--rejoin_cooldown=1",
                            "--grace_period=5", "--progress_interval=0.5", str(TRAIN), *JOB),
                 env=TFT_OFF)
    try:
        wait_for(lambda: log_has(log_dir, 1, f"step={KILL_AFTER} "), EVENT,
                 f"rank 1 past step {KILL_AFTER}")
        killed = spawned_pids(log_dir)[1]
        os.kill(killed, signal.SIGKILL)
        output = wait_job(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    return KilledJob(log_dir, output, killed)


def expected_phases(log_dir: Path) -> set[str]:
    """The recovery's phases, and ``straggling`` where the scheduler named a straggler: on
    two shared cores under load a rank can be 1.5x slower than its peer for 20 steps."""
    return {"cooldown", "re-forming", "resynchronising"} | (
        {"straggling"} if events(log_dir, "straggler") else set())


# ---------------------------------------------------------------------------- the trace
def test_the_trace_follows_the_trace_event_format(killed_job: KilledJob, tmp_path: Path) -> None:
    target = tmp_path / "trace.json"
    assert ctl.main(["report", "--log_dir", str(killed_job.log_dir), "--format", "trace",
                     "-o", str(target)]) == 0
    trace = json.loads(target.read_text())
    by_thread = check_trace(trace)
    entries = trace["traceEvents"]

    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in entries
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[(0, 0)] == "rank 0" and names[(0, 1)] == "rank 1"
    assert [e["args"]["name"] for e in entries if e["name"] == "process_name"] == ["node 0"]
    lives = {rank: [e for e in by_thread[(0, rank)] if e["cat"] == "incarnation"]
             for rank in (0, 1)}
    assert len(lives[0]) == 1 and len(lives[1]) == 2
    assert (lives[1][0]["args"]["ending"], lives[1][0]["args"]["exit"]) == ("failed", "SIGKILL")
    assert lives[1][0]["args"]["pid"] == killed_job.killed_pid

    # The fault is an instant on rank 1's thread, at the fault event's time.
    start = trace["otherData"]["start_unix_s"]
    [fault] = events(killed_job.log_dir, "fault")
    [instant] = [e for e in entries if e["ph"] == "i" and e["cat"] == "fault"]
    assert (instant["pid"], instant["tid"], instant["args"]["cause"]) == (0, 1, "SIGKILL")
    assert abs(instant["ts"] - (fault["ts"] - start) * 1e6) <= 1

    phases = {e["name"].split(" generation")[0] for e in entries
              if e.get("cat") in ("recovery phase", "straggler")}
    assert phases == expected_phases(killed_job.log_dir)
    [recovery] = [e for e in entries if e.get("cat") == "recovery"]
    assert recovery["args"]["source"] == "checkpoint" and recovery["args"]["steps_redone"] > 0


# ---------------------------------------------------------------------------- the HTML
def _html(killed_job: KilledJob, tmp_path: Path) -> Path:
    target = tmp_path / "report.html"
    assert ctl.main(["report", "--log_dir", str(killed_job.log_dir), "-o", str(target)]) == 0
    return target


def test_the_html_draws_a_lane_per_rank_and_the_kill_where_it_happened(
        killed_job: KilledJob, tmp_path: Path) -> None:
    page = _html(killed_job, tmp_path).read_text()
    svg = SvgElements(page)
    assert "script" not in svg.tags and "link" not in svg.tags
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")

    lanes = {int(lane["data-rank"]): lane for lane in svg.of("lane")}
    assert sorted(lanes) == [0, 1]
    [fault] = svg.of("fault")
    assert (fault["data-rank"], fault["data-cause"]) == ("1", "SIGKILL")
    # Where the kill was: at the end of rank 1's first bar, the one that failed.
    [failed] = [bar for bar in svg.of("incarnation") if bar["data-ending"] == "failed"]
    assert failed["data-rank"] == "1"
    assert abs(float(fault["data-x"]) - (float(failed["x"]) + float(failed["width"]))) < 3
    lane = lanes[1]
    assert float(lane["data-y"]) <= float(failed["y"]) < float(lane["data-y"]) + float(lane["data-height"])

    assert {p["data-phase"] for p in svg.of("phase")} == expected_phases(killed_job.log_dir)
    assert [g["data-generation"] for g in svg.of("generation")] == ["0", "1"]
    [recovery] = svg.of("recovery")
    assert recovery["data-source"] == "checkpoint"
    assert {line["data-rank"] for line in svg.of("steps")} == {"0", "1"}
    [redone] = svg.of("redone")
    assert int(redone["data-steps"]) > 0
    assert "Every rank ended with the same parameters." in page
    assert "left out" not in page  # every event a real job writes is of its fields' types


def test_the_progress_lines_show_steps_eta_and_the_re_forming(killed_job: KilledJob) -> None:
    lines = [line for line in killed_job.output.splitlines() if " tftrun: progress " in line]
    assert any(f"/{STEPS} " in line and "steps/s" in line and "ETA" in line for line in lines), lines
    assert any("re-forming generation 1" in line for line in lines), lines


def test_an_archived_run_is_reported_and_an_empty_dir_says_where_runs_are(
        killed_job: KilledJob, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = tmp_path / "logs"
    shutil.copytree(killed_job.log_dir, logs)
    archived = archive_previous_run(logs)
    assert archived is not None
    assert ctl.main(["report", "--log_dir", str(archived), "-o", str(tmp_path / "a.html")]) == 0
    assert "2 ranks, 1 fault, 1 recovery" in capsys.readouterr().out
    assert ctl.main(["report", "--log_dir", str(logs)]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and f"archived runs: {archived}" in said


# ---------------------------------------------------------------------------- a real browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium")
def test_a_headless_chromium_draws_the_lanes(killed_job: KilledJob, tmp_path: Path) -> None:
    """Opt-in (it runs where Chromium is installed): the page as a browser renders it."""
    page = _html(killed_job, tmp_path)
    shot = tmp_path / "shot.png"
    assert CHROMIUM is not None
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1240,400",
                    f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=60, check=True)
    image = read_png(shot.read_bytes())
    assert (image.width, image.height) == (1240, 400)
    # Browsers put the SVG below the headings; find each lane's row by its bar colours.
    colours_by_row = [{image.pixel(x, y) for x in range(0, image.width, 4)}
                      for y in range(image.height)]
    assert len(set().union(*colours_by_row)) > 20, "a blank page"
    failed_red, succeeded_green, cooldown_yellow = (229, 57, 53), (67, 160, 71), (253, 216, 53)
    rows_with = {colour: [y for y, row in enumerate(colours_by_row) if colour in row]
                 for colour in (failed_red, succeeded_green, cooldown_yellow)}
    assert rows_with[failed_red] and rows_with[succeeded_green] and rows_with[cooldown_yellow]
    # Rank 1's failed bar and its cooldown share a lane, below rank 0's lane.
    assert set(rows_with[failed_red]) & set(rows_with[cooldown_yellow])
    assert min(rows_with[succeeded_green]) < min(rows_with[failed_red])
