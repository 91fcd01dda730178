"""``tftctl status``: the table it prints and the last fault it names ("no job" without a
live scheduler: tests/integration/test_status_dead_scheduler.py)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from launcher.cli.status import describe_last_fault, format_status, last_fault_events
from recovery.events import newest_events

STATUS = {
    "ok": True, "run_id": "r1", "generation": 2, "worker_num": 3, "missing": [2],
    "pid": 4000, "host": "127.0.0.1", "started": 1000.0,
    "members": [
        {"node_id": "0", "rank": 0, "pid": 4001, "incarnation": 1, "host": "h",
         "state": "alive", "step": 17, "phase": "updating", "heartbeat_age": 0.42, "cooldown_left": 0.0},
        {"node_id": "1", "rank": 1, "pid": 4002, "incarnation": 0, "host": "h",
         "state": "hung", "step": 12, "phase": "computing", "heartbeat_age": 0.3, "cooldown_left": 0.0},
        {"node_id": "2", "rank": 2, "pid": 4003, "incarnation": 0, "host": "h",
         "state": "dead", "step": None, "phase": None, "heartbeat_age": None, "cooldown_left": 12.34},
    ],
}


def test_the_table_has_a_row_per_member_with_every_column() -> None:
    lines = format_status(STATUS, now=1065.0).splitlines()
    assert lines[0] == ("job r1: generation 2, 2/3 workers live, missing ranks [2]; "
                        "scheduler pid 4000 on 127.0.0.1, up 65s")
    assert lines[2].split() == ["node", "rank", "pid", "incarnation", "state", "heartbeat",
                                "step", "phase", "cooldown"]
    assert lines[3].split() == ["0", "0", "4001", "1", "alive", "0.4s", "ago", "17", "updating",
                                "-"]
    assert lines[4].split() == ["1", "1", "4002", "0", "hung", "0.3s", "ago", "12", "computing",
                                "-"]
    assert lines[5].split() == ["2", "2", "4003", "0", "dead", "-", "-", "-", "12.3s"]


def test_the_header_names_the_retired_ranks() -> None:
    """Retired for good (docs/elastic.md): not missing, and said so."""
    retired = {**STATUS, "missing": [], "retired": [2]}
    assert format_status(retired, now=1065.0).splitlines()[0] == (
        "job r1: generation 2, 2/3 workers live, retired ranks [2]; "
        "scheduler pid 4000 on 127.0.0.1, up 65s")


FAULT = {"ts": 1000.0, "event": "fault", "rank": 1, "pid": 4002, "incarnation": 0,
         "cause": "uce"}


def test_the_last_fault_line_names_the_newest_fault_and_its_recovery() -> None:
    older = {**FAULT, "ts": 900.0, "rank": 0, "cause": "SIGKILL"}
    recovered = {"ts": 1000.8, "event": "recovered", "generation": 1, "step": 40,
                 "seconds": 0.8, "source": "in_place"}
    assert describe_last_fault([], now=1010.0) == "last fault: none"
    assert describe_last_fault([older, recovered, FAULT], now=1010.0) == (
        "last fault: rank 1 cause=uce 10s ago; not recovered yet")
    assert describe_last_fault([older, FAULT, recovered], now=1010.0) == (
        "last fault: rank 1 cause=uce 10s ago; recovered in 0.8 s (source in_place)")
    rollback = {"ts": 1000.5, "event": "rollback", "step": 40, "source": "checkpoint"}
    assert describe_last_fault([FAULT, rollback], now=1010.0) == (
        "last fault: rank 1 cause=uce 10s ago; rolled back to step 40 (source checkpoint)")
    assert describe_last_fault([FAULT, rollback, {**recovered, "source": None}],
                               now=1010.0).endswith("recovered in 0.8 s (source checkpoint)")


def test_the_last_fault_is_read_from_the_end_of_the_events_file(tmp_path: Path) -> None:
    """Before the newest fault the file may hold a week of steps: they are never read (a
    sparse gigabyte stands for them here)."""
    path = tmp_path / "events.jsonl"
    with open(path, "wb") as file:
        file.truncate(1 << 30)
    older = {**FAULT, "ts": 900.0, "rank": 0, "cause": "SIGKILL"}
    recovered = {"ts": 1000.8, "event": "recovered", "generation": 1, "step": 40,
                 "seconds": 0.8, "source": "in_place"}
    steps = [{"ts": 1000.0 + i, "event": "step", "rank": 0, "step": i} for i in range(300)]
    with open(path, "a") as file:
        file.write("\n")
        for event in (older, FAULT, *steps, recovered, *steps):
            file.write(json.dumps(event) + "\n")
    assert last_fault_events(tmp_path) == [FAULT, recovered]
    newest = newest_events(path, ["fault"], chunk=64)  # lines cut across chunks
    assert [e["ts"] for e in itertools.islice(newest, 2)] == [1000.0, 900.0]
    assert last_fault_events(tmp_path / "nowhere") == []
