"""The log directory: keeping earlier runs' logs, reading the last lines, streaming output."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from recovery.ckpt.durable import create_numbered_dir
from recovery.events import EVENTS_FILE

__all__ = ["archive_previous_run", "last_lines", "LogFollower", "PREVIOUS_DIR"]

PREVIOUS_DIR = "previous"
_RUN_FILES = ("worker_*.log", "scheduler.log", EVENTS_FILE, "errors")
TAIL_BYTES = 16384
"""Bytes of a log's end that :func:`last_lines` reads."""
FOLLOW_INTERVAL = 0.1
"""Seconds between two reads of the followed logs (``--join``)."""


def archive_previous_run(log_dir: Path, worker_logs: str = "worker_*.log") -> Path | None:
    """Move an earlier run's files in ``log_dir`` to ``log_dir/previous/<n>/``, so a new run neither destroys
    them nor mixes with them; the archive folder, or None when there was nothing to keep."""
    patterns = dict.fromkeys((worker_logs, *_RUN_FILES))
    found = list(dict.fromkeys(p for pattern in patterns for p in sorted(log_dir.glob(pattern))))
    if not found:
        return None
    target = create_numbered_dir(log_dir / PREVIOUS_DIR)
    for path in found:
        path.rename(target / path.name)
    return target


def last_lines(path: Path, count: int) -> list[str]:
    """The last ``count`` non-empty lines of a (possibly large) text file."""
    text = _tail(path, TAIL_BYTES)[1].decode(errors="replace")
    return [line for line in text.splitlines() if line.strip()][-count:]


def _tail(path: Path, size: int) -> tuple[int, bytes]:
    """The offset of the last ``size`` bytes of ``path``, and those bytes; ``(0, b"")`` if it cannot be read."""
    try:
        with open(path, "rb") as file:
            start = max(0, file.seek(0, 2) - size)
            file.seek(start)
            return start, file.read()
    except OSError:
        return 0, b""


class LogFollower(threading.Thread):
    """Streams new lines of several log files to ``sink`` (``tftrun --join=True``)."""

    def __init__(self, sink: Callable[[str, str], None]) -> None:
        super().__init__(name="tftrun-log-follower", daemon=True)
        self._sink = sink
        self._files: dict[Path, tuple[str, int]] = {}
        self._lock = threading.Lock()
        self._stop_event = threading.Event()

    def follow(self, path: Path, label: str, after: str | None = None) -> None:
        """Stream ``path``, each line prefixed by ``label``, from just after its last line beginning with
        ``after`` (a launch's header: a forked process may have written lines before it is followed), else
        from its current end."""
        offset = _after_last(path, after.encode()) if after else None
        if offset is None:
            offset = path.stat().st_size if path.exists() else 0
        with self._lock:
            self._files[path] = (label, offset)

    def run(self) -> None:
        while not self._stop_event.wait(FOLLOW_INTERVAL):
            self.drain()

    def drain(self) -> None:
        """Emit every complete line written since the last call."""
        with self._lock:
            files = dict(self._files)
        for path, (label, offset) in files.items():
            try:
                with open(path, "rb") as file:
                    file.seek(offset)
                    data = file.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1
            for line in data[:end].decode(errors="replace").splitlines():
                self._sink(label, line)
            with self._lock:
                self._files[path] = (label, offset + end)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join()
        self.drain()


HEADER_SEARCH = 1 << 16
"""Bytes at the end of a log searched for a launch's header: what a process can have
written between its start and the follower's first look."""


def _after_last(path: Path, prefix: bytes) -> int | None:
    """The offset just after the last line of ``path`` that begins with ``prefix``, looked
    for in its last :data:`HEADER_SEARCH` bytes; None if none is there."""
    start, tail = _tail(path, HEADER_SEARCH)
    at = tail.rfind(b"\n" + prefix)
    at = at + 1 if at >= 0 else (0 if start == 0 and tail.startswith(prefix) else -1)
    if at < 0:
        return None
    end = tail.find(b"\n", at)
    return None if end < 0 else start + end + 1
