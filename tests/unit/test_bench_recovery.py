"""The recovery bench's arithmetic on step logs the test writes: recovery time, steps redone, rate,
and what one invocation measures and how its table compares the columns."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from support import REPO

sys.path.insert(0, str(REPO / "bench"))
from fault_recovery import MODES, Column, columns, recovery, spare_warm_time, steady_rate, survivors_idle, table  # noqa: E402 - bench/ is not a package
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


def test_steady_rate_since_a_time_leaves_out_the_steps_completed_before_it(tmp_path: Path) -> None:
    """A spare warming up slows the first seconds: the rate after it counts only later steps."""
    write_log(tmp_path, 0, [(step, step * 0.2 if step <= 50 else 10 + (step - 50) * 0.1, 10)
                         for step in range(1, 101)])
    slow_then_fast = read_steps(tmp_path)
    assert steady_rate(slow_then_fast, warmup_steps=20) < 1 / 0.1
    assert steady_rate(slow_then_fast, warmup_steps=20, since=10.0) == pytest.approx(1 / 0.1)


def test_the_spare_is_warm_at_its_spawn_plus_the_warm_up_it_reports(tmp_path: Path) -> None:
    assert spare_warm_time(tmp_path) is None  # no spare.log: no spare
    (tmp_path / "spare.log").write_text(
        "==== tftrun: spare rank=None incarnation=0 ====\ntftrun spare pid=42: warm after 7.49s\n")
    (tmp_path / "events.jsonl").write_text(
        '{"ts": 100.0, "event": "spawn", "role": "worker", "pid": 41}\n'
        '{"ts": 103.5, "event": "spawn", "role": "spare", "pid": 42}\n')
    assert spare_warm_time(tmp_path) == pytest.approx(110.99)


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
