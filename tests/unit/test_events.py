"""events.jsonl is best-effort: a full or failing log volume and a lock held by a stopped
writer cost a warning, never the process and never an unbounded wait."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from recovery import events as events_module
from recovery.events import EVENTS_FILE, LOCK_TIMEOUT, EventLog, newest_events, read_events

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


def test_a_lock_held_by_a_stopped_writer_delays_an_event_but_loses_it_not(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = EventLog(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from filelock import FileLock; "
         f"lock = FileLock({str(tmp_path / EVENTS_FILE) + '.lock'!r}); lock.acquire(); "
         "print('held', flush=True); "
         "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        holder.send_signal(signal.SIGSTOP)  # a writer frozen while it holds the lock
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="recovery.events"):
            log.emit("fault", rank=1)
        waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.communicate()
    assert LOCK_TIMEOUT <= waited < LOCK_TIMEOUT + 5
    assert "written without it" in caplog.text
    assert [e["event"] for e in read_events(tmp_path)] == ["fault"]


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
