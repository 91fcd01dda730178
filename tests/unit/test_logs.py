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


def test_follower_streams_a_launch_from_its_header_whatever_it_wrote_before_the_look(
        tmp_path: Path) -> None:
    """A worker forked warm can write its lines, or end, before tftrun follows its log:
    they are streamed all the same, from just after its launch's header; an earlier
    launch's lines are not."""
    path = tmp_path / "worker_1.log"
    path.write_text("==== tftrun: worker rank=1 incarnation=0 ====\nold\n"
                    "==== tftrun: worker rank=1 incarnation=1 ====\nrank 1 done\n")
    seen: list[tuple[str, str]] = []
    follower = LogFollower(lambda label, line: seen.append((label, line)))
    follower.follow(path, "rank 1", after="==== tftrun: ")
    follower.drain()
    assert seen == [("rank 1", "rank 1 done")]
    fresh = tmp_path / "worker_2.log"
    fresh.write_text("no header here\n")
    follower.follow(fresh, "rank 2", after="==== tftrun: ")  # none: from the end
    with open(fresh, "a") as file:
        file.write("new\n")
    follower.drain()
    assert seen[1:] == [("rank 2", "new")]
