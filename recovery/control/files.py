"""The scheduler's two files: its state under the recovery path, its endpoint in the log dir.

``state.json`` lets a relaunched scheduler carry on; it is written atomically under a file lock, in a
folder only its owner may enter (it holds a digest of the job token). ``scheduler.json`` tells ``tftctl
status`` where to connect and holds no token: log dirs are often readable by others.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from recovery.ckpt.durable import write_atomic
from recovery.ckpt.layout import SCHEDULER_DIR as STATE_DIR

__all__ = ["StateFile", "Endpoint", "ENDPOINT_FILE", "STATE_DIR"]

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
ENDPOINT_FILE = "scheduler.json"


def _read_json(path: Path) -> dict[str, Any] | None:
    """The object in ``path``; ``None`` when it is missing or not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        logger.warning("ignoring %s: %s", path, err)
        return None
    return data if isinstance(data, dict) else None


class StateFile:
    """``<recovery_path>/scheduler/state.json``, read and written under a file lock."""

    def __init__(self, recovery_path: str | os.PathLike[str]) -> None:
        self.path = Path(recovery_path) / STATE_DIR / STATE_FILE
        self._lock = FileLock(str(self.path) + ".lock")
        self._private = False

    def load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        with self._lock:
            return _read_json(self.path)

    def save(self, data: dict[str, Any]) -> None:
        # No indent: an indented dump runs json's pure-Python encoder, too slow for a large job's state.
        self.save_text(json.dumps(data, sort_keys=True))

    def save_text(self, text: str) -> None:
        """Save state already encoded as JSON (the scheduler compares it with the last one saved first:
        one encoding, not two)."""
        if not self._private:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.path.parent.chmod(0o700)
            self._private = True
        payload = text.encode()
        with self._lock:
            write_atomic(self.path, lambda file: file.write(payload))

    def touch(self) -> None:
        """Set the file's modification time to now, content unchanged (nothing when missing):
        the state is alive, though nothing changed to save."""
        try:
            os.utime(self.path)
        except FileNotFoundError:
            pass


@dataclass(frozen=True)
class Endpoint:
    """Where a running scheduler serves."""

    host: str
    port: int
    pid: int
    run_id: str
    started: float

    def write(self, log_dir: str | os.PathLike[str]) -> None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        payload = json.dumps(asdict(self), sort_keys=True).encode()
        write_atomic(Path(log_dir) / ENDPOINT_FILE, lambda file: file.write(payload))

    def remove(self, log_dir: str | os.PathLike[str]) -> None:
        """Remove the file if it is still this scheduler's (a relaunch may have replaced it)."""
        if Endpoint.read(log_dir) == self:
            (Path(log_dir) / ENDPOINT_FILE).unlink(missing_ok=True)

    @classmethod
    def read(cls, log_dir: str | os.PathLike[str]) -> Endpoint | None:
        data = _read_json(Path(log_dir) / ENDPOINT_FILE)
        if data is None:
            return None
        try:
            return cls(str(data["host"]), int(data["port"]), int(data["pid"]),
                       str(data["run_id"]), float(data["started"]))
        except (KeyError, TypeError, ValueError):
            return None
