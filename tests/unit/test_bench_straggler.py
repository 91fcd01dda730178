"""bench/straggler.py's arithmetic on step logs the test makes: the rates before and after a
slow-down, the steps to recover, what the events say of the detector, and the shape of
its ``--json`` line."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import pytest

from support import REPO

sys.path.insert(0, str(REPO / "bench"))
from common import absolute_pythonpath, emit  # noqa: E402 - bench/ is not a package
from fault_recovery import Run  # noqa: E402
from jobs.step_log import StepRecord  # noqa: E402
from straggler import figures, steps_to_recover, survivors_rate  # noqa: E402

SLOW_RANK, SLOW_AT, MAX_STEPS, EVICTED_AT = 2, 40, 100, 60


def records(rank: int, seconds_per_step: dict[range, float], pid: int = 100) -> list[StepRecord]:
    """A rank's completed steps, each range of steps taking its seconds per step."""
    done, now = [StepRecord(rank, 0, 0.0, pid)], 0.0
    for steps, seconds in seconds_per_step.items():
        for step in steps:
            now += seconds
            done.append(StepRecord(rank, step, now, pid))
    return done


def slowed_run(evicted: bool, loss: float = 1.0) -> Run:
    """3 ranks at 10 steps/s; rank 2 slows all to 5 steps/s from step 40; evicted at step
    60 (the survivors back at 10 steps/s), or not (5 steps/s to the end)."""
    after = 0.1 if evicted else 0.2
    pace = {range(1, SLOW_AT + 1): 0.1, range(SLOW_AT + 1, EVICTED_AT + 1): 0.2,
            range(EVICTED_AT + 1, MAX_STEPS + 1): after}
    steps = {rank: records(rank, pace) for rank in range(2)}
    steps[SLOW_RANK] = records(SLOW_RANK, pace)[:EVICTED_AT + 1 if evicted else None]
    fault_at = steps[0][SLOW_AT].time
    events = [{"event": "straggler", "rank": SLOW_RANK, "ts": fault_at + 3.0}]
    if evicted:
        events.append({"event": "verdict", "verdict": "straggler", "rank": SLOW_RANK,
                       "ts": steps[0][EVICTED_AT].time + 0.01})
    return Run(steps[0][-1].time, steps, fault_at, (1.0, 2.0), {}, events, loss)


def clean_run(seconds_per_step: float, loss: float = 1.0) -> Run:
    steps = {rank: records(rank, {range(1, MAX_STEPS + 1): seconds_per_step}) for rank in range(3)}
    return Run(steps[0][-1].time, steps, None, (1.0, 2.0), {}, [], loss)


def args() -> argparse.Namespace:
    return argparse.Namespace(workers=3, slow_rank=SLOW_RANK, factor=3.0, slow_at=SLOW_AT,
                              max_steps=MAX_STEPS, save_steps=100, warmup_steps=10,
                              overhead_rounds=1, tftrun_arg=[], json=True)


def test_the_rates_leave_the_slowed_rank_out_and_recovery_needs_a_whole_stretch_at_pace() -> None:
    run = slowed_run(evicted=True)
    assert survivors_rate(run.steps, SLOW_RANK, 10, SLOW_AT) == pytest.approx(10.0)
    assert survivors_rate(run.steps, SLOW_RANK, SLOW_AT, EVICTED_AT) == pytest.approx(5.0)
    # A 20-step stretch from step 40 + k runs 200 / (k' + 20) steps/s with k' = 60 - (40 + k)
    # slow steps in it: at least 9 (0.9x) from k' = 2 on, that is k = 18.
    assert steps_to_recover(run.steps, SLOW_RANK, SLOW_AT, 0, 10.0) == 18
    # From the eviction on only: a stretch at pace before it is noise.
    assert steps_to_recover(run.steps, SLOW_RANK, SLOW_AT, EVICTED_AT + 5, 10.0) == 25
    assert steps_to_recover(slowed_run(evicted=False).steps, SLOW_RANK, SLOW_AT, 0, 10.0) is None


def test_the_json_line_has_the_issues_shape_and_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    result = figures(args(), [clean_run(0.1, loss=2.0)], [clean_run(0.099)],
                     evict=slowed_run(evicted=True, loss=2.0002),
                     report=slowed_run(evicted=False), torch=slowed_run(evicted=False))
    emit(result, True)
    last = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert isinstance(last["detector_overhead"], float) and 0 < last["detector_step_us"] < 1000
    for name in ("report", "torchrun"):
        assert last[name]["after_ratio"] == pytest.approx(0.5)
    evict = last["evict"]
    # evicted at step 60: back at pace from there
    assert isinstance(evict["steps_to_recover"], int) and evict["steps_to_recover"] == 20
    assert isinstance(evict["after_ratio"], float) and isinstance(evict["job_ratio"], float)
    assert evict["after_ratio"] == pytest.approx(1.0)
    assert evict["job_ratio"] == pytest.approx(slowed_run(evicted=True).wall_seconds / 10.0)
    assert (evict["evicted"], evict["evicted_at_step"], evict["named_after_s"]) == (
        [SLOW_RANK], EVICTED_AT, pytest.approx(3.0))
    assert evict["final_loss_rel_diff"] == pytest.approx(1e-4)
    assert last["detector_overhead"] == pytest.approx(0.1 / 0.099)
    assert last["report"]["evicted"] == [] and not math.isnan(last["report"]["named_after_s"])


def test_pythonpath_entries_become_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([".", "", "/abs"]))
    absolute_pythonpath()
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(tmp_path.resolve()), "/abs"])
