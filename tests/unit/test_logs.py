"""The log dir keeps earlier runs; last lines are read from the end of big files."""

from __future__ import annotations

from pathlib import Path

from launcher.view.logs import LogFollower, archive_previous_run, last_lines


def test_previous_runs_are_moved_aside_never_overwritten(tmp_path: Path) -> None:
    assert archive_previous_run(tmp_path) is None
    (tmp_path / "worker_0.log").write_text("first run\n")
    (tmp_path / "events.jsonl").write_text("{}\n")
    first = archive_previous_run(tmp_path)
    (tmp_path / "worker_0.log").write_text("second run\n")
    second = archive_previous_run(tmp_path)
    assert first == tmp_path / "previous" / "1"
    assert second == tmp_path / "previous" / "2"
    assert (first / "worker_0.log").read_text() == "first run\n"
    assert (first / "events.jsonl").exists()
    assert (second / "worker_0.log").read_text() == "second run\n"
    assert not (tmp_path / "worker_0.log").exists()


def test_last_lines_skips_blank_lines_and_reads_only_the_tail(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_text("".join(f"line {i}\n" for i in range(100_000)) + "\n\n")
    assert last_lines(path, 2) == ["line 99998", "line 99999"]
    assert last_lines(tmp_path / "missing.log", 3) == []


def test_follower_streams_only_complete_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "worker_0.log"
    path.write_text("before\n")
    seen: list[tuple[str, str]] = []
    follower = LogFollower(lambda label, line: seen.append((label, line)))
    follower.follow(path, "rank 0")
    with open(path, "a") as file:
        file.write("one\ntw")
    follower.drain()
    assert seen == [("rank 0", "one")]
    with open(path, "a") as file:
        file.write("o\n")
    follower.drain()
    assert seen == [("rank 0", "one"), ("rank 0", "two")]
