"""The recovery bench's arithmetic on step logs the test writes: recovery time, steps redone, rate,
the samples/s while degraded from synthetic events, and what one invocation measures and how
its table compares the columns."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from support import REPO

sys.path.insert(0, str(REPO / "bench"))
from fault_recovery import (  # noqa: E402 - bench/ is not a package
    BY_FAULT_FREE,
    BY_WHOLE,
    DEGRADED,
    FAULT_FREE,
    MODES,
    WHOLE,
    Column,
    columns,
    degraded_generations,
    degraded_lines,
    degraded_samples,
    recovery,
    steady_rate,
    survivors_idle,
    table,
)
from jobs.step_log import FAULT_FILE, StepRecord, read_fault_time, read_steps, steps_file  # noqa: E402

FAULT_AT = 100.0


def write_log(directory: Path, rank: int, records: list[tuple[int, float, int]], torn: str = "") -> None:
    """``records``: (step, time, pid) of rank ``rank``; ``torn``: a half line appended at the end."""
    text = "".join(StepRecord(rank, step, time, pid).line() for step, time, pid in records)
    steps_file(directory, rank).write_text(text + torn)


def steps_up_to(last: int, pid: int, start_time: float = 90.0) -> list[tuple[int, float, int]]:
    """Steps 1..last of one process, 0.1 s apart, ending before the kill."""
    return [(step, start_time + step * 0.1, pid) for step in range(1, last + 1)]


def test_rollback_survivors_keep_pids_and_a_straggler_is_not_recovery(tmp_path: Path) -> None:
    # tftrun-like: rank 1 dies after step 50 (pid 11 -> 12); rank 0 keeps pid 10, logs its
    # in-flight step 50 just after the kill, then both resume at 41.
    write_log(tmp_path, 0, [*steps_up_to(49, 10), (50, 100.02, 10), (41, 107.0, 10), (42, 107.1, 10)])
    write_log(tmp_path, 1, [*steps_up_to(50, 11), (41, 107.5, 12), (42, 107.6, 12)])
    result = recovery(read_steps(tmp_path), FAULT_AT)
    assert result.seconds == pytest.approx(7.5)
    assert result.steps_redone == 50 - 40


def test_restart_all_new_pids_everywhere(tmp_path: Path) -> None:
    # torchrun-like: every rank restarts, the torn line of a SIGTERMed survivor is skipped.
    write_log(tmp_path, 0, [*steps_up_to(50, 10), (41, 112.0, 20)], torn="0 5")
    write_log(tmp_path, 1, [*steps_up_to(50, 11), (41, 111.0, 21)])
    result = recovery(read_steps(tmp_path), FAULT_AT)
    assert result.seconds == pytest.approx(12.0)
    assert result.steps_redone == 10


def test_no_work_lost_when_survivors_continue_past_the_kill_step(tmp_path: Path) -> None:
    # replica/last-words-like: the survivor's next step follows on, but lies beyond step 50.
    write_log(tmp_path, 0, [*steps_up_to(50, 10), (51, 103.0, 10)])
    write_log(tmp_path, 1, [*steps_up_to(50, 11), (51, 103.0, 12)])
    assert recovery(read_steps(tmp_path), FAULT_AT).steps_redone == 0


def test_in_place_repair_redoes_only_the_voided_step(tmp_path: Path) -> None:
    # uce-like: the fault voids step 50 on every rank before any completes it; nobody
    # restarts; rank 1 logs step 49 a moment after the fault (a straggler, not recovery),
    # then both redo 50 with their old pids.
    write_log(tmp_path, 0, [*steps_up_to(49, 10), (50, 100.25, 10)])
    write_log(tmp_path, 1, [*steps_up_to(48, 11), (49, 100.01, 11), (50, 100.3, 11)])
    result = recovery(read_steps(tmp_path), FAULT_AT)
    assert result.seconds == pytest.approx(0.3)
    assert result.steps_redone == 0


def test_a_rank_that_never_steps_again_is_an_error(tmp_path: Path) -> None:
    write_log(tmp_path, 0, [*steps_up_to(50, 10), (41, 107.0, 10)])
    write_log(tmp_path, 1, steps_up_to(50, 11))
    with pytest.raises(ValueError, match="rank 1"):
        recovery(read_steps(tmp_path), FAULT_AT)


def test_steady_rate_leaves_out_the_warm_up_and_takes_the_median_rank(tmp_path: Path) -> None:
    for rank, step_time in enumerate((0.1, 0.2, 0.4)):
        warm_up = [(step, step * 1.0, 10 + rank) for step in range(1, 21)]
        write_log(tmp_path, rank, warm_up + [(step, 20 + (step - 20) * step_time, 10 + rank)
                                             for step in range(21, 101)])
    assert steady_rate(read_steps(tmp_path), warmup_steps=20) == pytest.approx(1 / 0.2)


def test_fault_time_round_trips(tmp_path: Path) -> None:
    (tmp_path / FAULT_FILE).write_text(repr(1795432853.5401275))
    assert read_fault_time(tmp_path) == 1795432853.5401275


def test_a_kill_compares_torchrun_with_tftrun_in_the_mode_asked() -> None:
    assert columns("kill", "replica") == [Column("torchrun", "torchrun", "kill", "rollback"),
                                          Column("tftrun replica", "tftrun", "kill", "replica")]


def test_a_uce_sets_in_place_repair_and_the_relaunch_path_beside_torchruns_restart() -> None:
    baseline, in_place, relaunch = columns("uce", "rollback")
    assert (baseline.system, baseline.fault, baseline.mode) == ("torchrun", "uce", "rollback")
    assert (in_place.system, in_place.fault) == ("tftrun", "uce")
    assert "UCE:1" in MODES[in_place.mode]
    assert (relaunch.system, relaunch.fault, relaunch.mode) == ("tftrun", "kill", "rollback")
    assert len({baseline.label, in_place.label, relaunch.label}) == 3
    assert (in_place.redone_target(20), relaunch.redone_target(20)) == ("0", "<= 20")


def test_the_table_gives_each_tftrun_column_its_ratio_to_torchrun() -> None:
    measured = columns("uce", "rollback")
    figures = {measured[0].label: {"recovery s": 8.0, "steps redone": 0.0},
               measured[1].label: {"recovery s": 0.2, "steps redone": 0.0},
               measured[2].label: {"recovery s": 6.0, "steps redone": 10.0}}
    header, recovery_line, redone_line = table(measured, figures, {"recovery s": "<= 0.3",
                                                                  "steps redone": "0"})
    assert header.split()[0] == "figure" and header.count("ratio") == 2
    assert recovery_line.split() == ["recovery", "s", "8.000", "0.200", "0.03", "6.000", "0.75", "<=", "0.3"]
    # A baseline of 0 gives no ratio rather than an error.
    assert redone_line.split()[2:] == ["0.000", "0.000", "nan", "10.000", "nan", "0"]


def test_degraded_survivors_idle_is_their_longest_gap_beyond_a_normal_step(tmp_path: Path) -> None:
    """Rank 1 dies after step 100 and never comes back before the end; rank 0 trains on
    after a 0.6 s gap (0.1 s a step): 0.5 s idle; recovery is rank 0's alone."""
    write_log(tmp_path, 0, [*steps_up_to(100, 10, start_time=90.0),
                            (101, 100.6, 10), (102, 100.7, 10)])
    write_log(tmp_path, 1, steps_up_to(100, 11, start_time=90.0))
    steps = read_steps(tmp_path)
    assert survivors_idle(steps, 1, FAULT_AT) == pytest.approx(0.5)
    assert recovery(steps, FAULT_AT, may_stay_out=1).seconds == pytest.approx(0.6)
    with pytest.raises(ValueError, match="rank 1 never completed a step"):
        recovery(steps, FAULT_AT)


def step_event(ts: float, rank: int, step: int, generation: int, batch: int | None,
               why: str = "interval") -> dict[str, object]:
    return {"ts": ts, "event": "step", "rank": rank, "step": step, "total": 400,
            "batch": batch, "generation": generation, "why": why}


def membership(ts: float, generation: int, active: list[int], why: str) -> dict[str, object]:
    return {"ts": ts, "event": "membership", "active": active, "world": len(active),
            "generation": generation, "why": why}


def degraded_job(batch_while_degraded: int) -> list[dict[str, object]]:
    """4 ranks, batch 32 a rank (128 job-wide): rank 2 dies at t=10 after step 100;
    ranks 0, 1 and 3 train at W=3 from t=10.5 to t=20 (steps 100 to 250), then rank 2 is
    back (generation 2). Rank 3 is slower to write; rank 1 writes one event while degraded."""
    found: list[dict[str, object]] = [membership(0.0, 0, [0, 1, 2, 3], "start")]
    for rank in (0, 1, 3):
        found += [step_event(1.0, rank, 20, 0, 128), step_event(9.0, rank, 90, 0, 128),
                  step_event(10.1, rank, 100, 0, 128, "paused")]
    found.append(membership(10.2, 1, [0, 1, 3], "shrink"))
    for rank in (0, 1, 3):  # restored at 100, then train 150 steps in 9.5 s
        found.append(step_event(10.5, rank, 100, 1, 128, "restored"))
    found += [step_event(15.5, 0, 180, 1, batch_while_degraded),
              step_event(20.0, 0, 250, 1, batch_while_degraded),
              step_event(20.0, 3, 250, 1, batch_while_degraded),
              membership(20.1, 2, [0, 1, 2, 3], "grow"),
              step_event(20.2, 0, 251, 1, batch_while_degraded, "paused"),
              step_event(20.3, 0, 251, 2, 128, "restored"),
              step_event(21.3, 0, 300, 2, 128)]
    return found


def clean_job() -> list[dict[str, object]]:
    """Fault-free: 10 steps/s of 128 samples from step 20 on, slower before."""
    return [membership(0.0, 0, [0, 1, 2, 3], "start"),
            *(step_event(ts, rank, step, 0, 128) for rank in range(4)
              for ts, step in ((0.5, 1), (3.0, 10), (4.0, 20), (14.0, 120), (24.0, 220)))]


def test_samples_per_second_while_degraded_counts_only_the_degraded_generation() -> None:
    """Rank 0 trained 150 steps of 128 samples in 9.5 s at W=3 (the span around the
    shrink, the pause and the heal left out); rank 3 the same in one span; rank 1 has a
    single event, no rate. The fault-free run: 200 steps of 128 in 20 s past step 10."""
    found = degraded_job(batch_while_degraded=128)
    assert degraded_generations(found, workers=4) == {1}
    figures = degraded_samples(found, clean_job(), workers=4, warmup_steps=10)
    assert figures[DEGRADED] == pytest.approx(150 * 128 / 9.5)
    assert figures[FAULT_FREE] == pytest.approx(200 * 128 / 20.0)
    assert figures[BY_FAULT_FREE] == pytest.approx((150 * 128 / 9.5) / 1280)
    # The same run at 4 ranks: steps 20 to 90 in 8 s on ranks 1 and 3; rank 0 also trained
    # 49 steps in 1 s once whole again (from the restored event: the pauses left out).
    assert figures[WHOLE] == pytest.approx(70 * 128 / 8.0)
    assert figures[BY_WHOLE] == pytest.approx((150 * 128 / 9.5) / 1120)


def test_under_the_shrink_policy_a_degraded_step_counts_its_smaller_batch() -> None:
    figures = degraded_samples(degraded_job(batch_while_degraded=96), clean_job(), workers=4,
                               warmup_steps=10)
    assert figures[DEGRADED] == pytest.approx(150 * 96 / 9.5)


def test_a_job_that_never_trained_degraded_has_no_degraded_rate() -> None:
    figures = degraded_samples(clean_job(), clean_job(), workers=4, warmup_steps=10)
    assert math.isnan(figures[DEGRADED])
    assert math.isnan(figures[BY_FAULT_FREE])
    assert figures[FAULT_FREE] == figures[WHOLE] == pytest.approx(1280)


def test_the_degraded_line_sets_the_ratio_beside_n_minus_1_over_n() -> None:
    figures = degraded_samples(degraded_job(batch_while_degraded=128), clean_job(), workers=4,
                               warmup_steps=10)
    never = degraded_samples(clean_job(), clean_job(), workers=4, warmup_steps=10)
    [line, none] = degraded_lines({"tftrun lose_nothing": {**figures, "(N-1)/N": 0.75},
                                   "tftrun in place": {**never, "(N-1)/N": 0.75}})
    assert line == ("tftrun lose_nothing: samples/s while degraded 2021.1; against fault-free "
                    "1280.0: 1.58x; against the same run at N ranks 1120.0: 1.80x; (N-1)/N = 0.75")
    assert none == "tftrun in place: never trained degraded"
