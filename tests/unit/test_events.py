"""events.jsonl is best-effort: a full or failing log volume costs a warning, never the
process (a lock held by a stopped writer: tests/integration/test_events_lock_holder.py)."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest

from recovery import events as events_module
from recovery.events import EVENTS_FILE, EventLog, newest_events, read_events

pytestmark = pytest.mark.timeout(30)


def test_a_full_log_volume_costs_one_warning_and_the_next_good_write_records_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``/dev/full`` answers every write with ENOSPC, as a full volume does (opened in
    place of the file: a link to it would be refused, see the next test)."""
    full = "/dev/full"
    monkeypatch.setattr(events_module, "open_append",
                        lambda path: os.open(full if Path(path).exists() else path,
                                             os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    (tmp_path / EVENTS_FILE).touch()
    log = EventLog(tmp_path)
    with caplog.at_level(logging.WARNING, logger="recovery.events"):
        assert log.emit("spawn", rank=0)["event"] == "spawn"
        assert log.emit("spawn", rank=1)["rank"] == 1
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        "events are not recorded ([Errno 28] No space left on device)"]
    (tmp_path / EVENTS_FILE).unlink()
    log.emit("exit", rank=0)
    assert [e["event"] for e in read_events(tmp_path)] == ["exit"]


def test_a_link_planted_in_place_of_the_events_file_is_refused_not_followed(
        tmp_path: Path) -> None:
    """Another user's ``events.jsonl -> ~/.bashrc`` in a shared folder: nothing is
    written through it."""
    victim = tmp_path / "bashrc"
    victim.write_text("# the user's own\n")
    (tmp_path / EVENTS_FILE).symlink_to(victim)
    EventLog(tmp_path).emit("spawn", rank=0)
    assert victim.read_text() == "# the user's own\n"


def test_reading_a_log_dir_while_it_is_being_made_never_fails(tmp_path: Path) -> None:
    """A test (or ``tftctl``) polls a node's log dir before tftrun has made it: whether
    the path is a folder must not be decided before it is read (seen in CI: the folder
    appeared between the two, and ``read_text`` met a directory)."""
    log_dir, stop = tmp_path / "logs", threading.Event()

    def make_and_remove() -> None:
        while not stop.is_set():
            log_dir.mkdir()
            log_dir.rmdir()

    churn = threading.Thread(target=make_and_remove)
    churn.start()
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            assert list(read_events(log_dir)) == []
            assert list(newest_events(log_dir, ["job_end"])) == []
    finally:
        stop.set()
        churn.join()
