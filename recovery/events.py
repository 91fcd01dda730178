"""``log_dir/events.jsonl`` (docs/events.md): one JSON line per lifecycle event, appended by
any process under a file lock. The record is best-effort: a held lock or a failed write costs a
warning, never the job."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from filelock import FileLock, Timeout

from recovery.safe_files import open_append

__all__ = ["EVENTS_FILE", "LOCK_TIMEOUT", "LOCK_POLL", "EventLog", "read_events",
           "newest_events"]

logger = logging.getLogger(__name__)

EVENTS_FILE = "events.jsonl"
LOCK_TIMEOUT = 2.0
"""Seconds an event waits for the file lock before it is written without it."""
LOCK_POLL = 0.001
"""Seconds between two tries of a held lock: it is held for one short write, and a longer
sleep would hold up the rank, and through the all-reduce every rank."""


class EventLog:
    """Appends events to ``<log_dir>/events.jsonl``; a ``None`` log_dir makes it a no-op.

    With ``node_rank``, every event carries it.
    """

    def __init__(self, log_dir: str | os.PathLike[str] | None,
                 node_rank: int | None = None) -> None:
        self._node = {} if node_rank is None else {"node_rank": node_rank}
        self.path = None if log_dir is None else Path(log_dir) / EVENTS_FILE
        self._lock = None if self.path is None else FileLock(str(self.path) + ".lock",
                                                             timeout=LOCK_TIMEOUT)
        self._failing: str | None = None
        """Why the last write failed, warned about once until a write succeeds."""

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event and return it. ``ts`` (unix seconds) and ``event`` come first, so
        that a line starts with what happened."""
        record: dict[str, Any] = {"ts": time.time(), "event": event, **fields, **self._node}
        self._write([record])
        return record

    def emit_all(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """Append ``(event, fields)`` pairs as :meth:`emit` does, in one write under one
        hold of the lock."""
        now = time.time()
        self._write([{"ts": now, "event": event, **fields, **self._node}
                     for event, fields in events])

    def _write(self, records: list[dict[str, Any]]) -> None:
        if self.path is None or self._lock is None or not records:
            return
        line = "".join(json.dumps(record, default=str) + "\n" for record in records).encode()
        try:
            try:
                with self._lock.acquire(poll_interval=LOCK_POLL):
                    self._append(line)
                self._failing = None
            except Timeout:
                self._warn("lock", f"its lock was held for over {LOCK_TIMEOUT:g}s: "
                           "events are written without it")
                self._append(line)
        except OSError as err:
            self._warn(err.strerror or str(err), f"events are not recorded ({err})")

    def _append(self, line: bytes) -> None:
        assert self.path is not None
        fd = open_append(self.path)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def _warn(self, kind: str, message: str) -> None:
        """Warn of a problem once, until a write goes through without one."""
        if kind != self._failing:
            logger.warning("%s: %s", self.path, message)
        self._failing = kind


def _open_events(path: Path) -> BinaryIO | None:
    """The events file ``path``, or the one in the log dir ``path``, open for reading; ``None``
    when there is none yet. Opening is tried rather than the path's type checked, which may
    change in between."""
    for candidate in (path, path / EVENTS_FILE):
        try:
            return open(candidate, "rb")
        except IsADirectoryError:
            continue
        except (FileNotFoundError, NotADirectoryError):
            return None
    return None


def read_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the events of an ``events.jsonl`` file (or of a log dir) in file order."""
    file = _open_events(Path(path))
    if file is None:
        return
    with file:
        text = file.read().decode(errors="replace")
    for line in text.splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue  # the torn tail of a writer killed mid-line


BACKWARDS_CHUNK = 1 << 20
"""Bytes :func:`newest_events` reads at a time, from the end of the file towards its start."""


def newest_events(path: str | os.PathLike[str], names: Collection[str],
                  chunk: int = BACKWARDS_CHUNK) -> Iterator[dict[str, Any]]:
    """Yield the events named ``names`` of an ``events.jsonl`` (or of a log dir), newest
    first, reading the file backwards: a caller that stops early reads only the end of a
    file that grows with the job's age."""
    needles = [json.dumps(name).encode() for name in names]
    file = _open_events(Path(path))
    if file is None:
        return
    with file:
        end = file.seek(0, os.SEEK_END)
        rest = b""  # the start of a line whose beginning is in the next chunk back
        while end > 0:
            start = max(0, end - chunk)
            file.seek(start)
            data = file.read(end - start) + rest
            lines = data.split(b"\n")
            rest = lines.pop(0) if start > 0 else b""
            if len(rest) > BACKWARDS_CHUNK:
                rest = b""  # no event is that long (a hole, garbage): skipped
            for line in reversed(lines):
                if any(needle in line for needle in needles):
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue  # the torn tail of a writer killed mid-line
                    if event.get("event") in names:
                        yield event
            end = start
