"""Reading the events of one job from its nodes' log dirs (an archived ``LOG_DIR/previous/<n>`` is one too).

An event without ``node_rank`` belongs to the node whose dir it was read from (its ``job_start`` says which).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from launcher.errors import ConfigError
from launcher.report.fields import well_typed
from launcher.view.logs import PREVIOUS_DIR
from recovery.events import EVENTS_FILE, read_events

__all__ = ["read_job", "job_is_running"]


def _archived(log_dir: Path) -> list[str]:
    folder = log_dir / PREVIOUS_DIR
    runs = [p for p in folder.iterdir() if (p / EVENTS_FILE).exists()] if folder.is_dir() else []
    return [str(p) for p in sorted(runs, key=lambda p: (len(p.name), p.name))]


def _read_node(log_dir: Path) -> list[dict[str, Any]]:
    if not (log_dir / EVENTS_FILE).is_file():
        archived = _archived(log_dir)
        hint = f" (archived runs: {', '.join(archived)})" if archived else ""
        raise ConfigError(f"no {EVENTS_FILE} in {log_dir}{hint}")
    events = [e for e in read_events(log_dir) if isinstance(e, dict)]
    start = next((e for e in events if e.get("event") == "job_start" and well_typed(e)), {})
    node = int(start.get("node_rank") or 0)
    return [{**e, "node_rank": e.get("node_rank", node)} for e in events]


def read_job(log_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """Every event of the job whose nodes logged to ``log_dirs``, each with its ``node_rank``; ConfigError for
    a dir without events."""
    return [event for log_dir in log_dirs for event in _read_node(log_dir)]


def job_is_running(events: list[dict[str, Any]]) -> bool:
    """Whether some node's tftrun has started and not ended, and still runs here."""
    ended = {e["node_rank"] for e in events if e.get("event") == "job_end"}
    for start in (e for e in events if e.get("event") == "job_start"):
        if start["node_rank"] in ended or not isinstance(start.get("pid"), int):
            continue
        try:
            if psutil.Process(start["pid"]).create_time() <= start["ts"]:
                return True
        except psutil.Error:
            continue
    return False
