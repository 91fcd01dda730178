"""``log_dir/events.jsonl``: one JSON object per lifecycle event, appended by any process.

The supervisor, the scheduler and the workers all append to the same file. Each event is
one ``write()`` of one line under a file lock, so lines from different processes never
interleave and a reader never sees half an object (a torn last line from a writer killed
mid-write is skipped by :func:`read_events`). The schema is in docs/events.md.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock

__all__ = ["EVENTS_FILE", "EventLog", "read_events"]

EVENTS_FILE = "events.jsonl"


class EventLog:
    """Appends events to ``<log_dir>/events.jsonl``; a ``None`` log_dir makes it a no-op.

    With ``node_rank``, every event carries it (``node_rank``): the node that wrote it.
    """

    def __init__(self, log_dir: str | os.PathLike[str] | None,
                 node_rank: int | None = None) -> None:
        self._node = {} if node_rank is None else {"node_rank": node_rank}
        self.path = None if log_dir is None else Path(log_dir) / EVENTS_FILE
        self._lock = None if self.path is None else FileLock(str(self.path) + ".lock")

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event and return it. ``ts`` (unix seconds) and ``event`` come first."""
        record: dict[str, Any] = {"ts": time.time(), "event": event, **self._node, **fields}
        if self.path is None or self._lock is None:
            return record
        line = (json.dumps(record, default=str) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        return record


def read_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the events of an ``events.jsonl`` file (or of a log dir) in file order."""
    path = Path(path)
    if path.is_dir():
        path = path / EVENTS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return
    for line in text.splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue  # the torn tail of a writer killed mid-line
