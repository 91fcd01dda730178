"""events.jsonl's lock held by a writer stopped while it holds it (a real process, frozen
with SIGSTOP): the event waits a bounded time, is written without the lock and is kept."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recovery.events import EVENTS_FILE, LOCK_TIMEOUT, EventLog, read_events

pytestmark = pytest.mark.timeout(30)


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
