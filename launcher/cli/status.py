"""``tftctl status --log_dir DIR``: the membership table of the job running there, asked of the scheduler
that ``DIR/scheduler.json`` names once it proved trusted (launcher/cli/trusted.py), and the newest fault.
A dead, untrusted or silent scheduler all mean the same to the user: no job is running in DIR.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from launcher.cli.trusted import UntrustedEndpoint, trusted_endpoint
from launcher.errors import TftrunError
from recovery.control.members import LIVE_STATES
from recovery.control.rpc import Op, SchedulerLink, SchedulerUnavailable
from recovery.events import newest_events

__all__ = ["status", "query", "connect", "format_status", "describe_last_fault",
           "last_fault_events", "NoJobError"]

ANSWER_TIMEOUT = 5.0
_COLUMNS = ("node", "rank", "pid", "incarnation", "state", "heartbeat", "step", "phase",
            "cooldown")


class NoJobError(TftrunError):
    """Nothing answers for the log dir."""


@contextmanager
def connect(log_dir: Path, timeout: float = ANSWER_TIMEOUT) -> Iterator[SchedulerLink]:
    """A link to the scheduler of ``log_dir``, its requests signed with its job's token; NoJobError when none
    of the user's own answers there, or a request fails."""
    try:
        trusted = trusted_endpoint(log_dir)
    except UntrustedEndpoint as err:
        raise NoJobError(f"no job is running in {log_dir}: {err}") from None
    endpoint = trusted.endpoint
    link = SchedulerLink(endpoint.host, endpoint.port, token=trusted.token,
                         reply_timeout=timeout, run_id=endpoint.run_id, epoch=trusted.epoch)
    try:
        if not link.wait_connected(timeout):
            raise NoJobError(f"no job is running in {log_dir}: the scheduler at "
                             f"{link.where} (pid {endpoint.pid}) does not answer")
        yield link
    except SchedulerUnavailable as err:
        raise NoJobError(f"no job is running in {log_dir}: {err}") from None
    finally:
        link.close()


def query(log_dir: Path, timeout: float = ANSWER_TIMEOUT) -> dict[str, Any]:
    """The status the scheduler of ``log_dir`` reports; NoJobError when none answers."""
    with connect(log_dir, timeout) as link:
        return link.call(Op.STATUS)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s ago"


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def format_status(status: dict[str, Any], now: float | None = None) -> str:
    """The header and the aligned table that ``tftctl status`` prints."""
    now = time.time() if now is None else now
    members = status["members"]
    alive = sum(1 for m in members if m["state"] in LIVE_STATES)  # a StrEnum: its values match
    generation = status["generation"]
    header = (f"job {status['run_id']}: "
              + (f"generation {generation}" if generation >= 0 else "no generation formed yet")
              + f", {alive}/{status['worker_num']} workers live"
              + ("" if not status["missing"] else f", missing ranks {status['missing']}")
              + ("" if not status.get("retired") else f", retired ranks {status['retired']}")
              + "".join(f", straggler rank {s['rank']} ({s['step_time'] / s['median']:.1f}x its "
                        f"peers' step time since step {s['since']})"
                        for s in status.get("stragglers", ()))
              + f"; scheduler pid {status['pid']} on {status['host']}, "
              f"up {now - status['started']:.0f}s")
    rows = [[m["node_id"], _cell(m["rank"]), _cell(m["pid"]), _cell(m["incarnation"]),
             m["state"], _age(m["heartbeat_age"]), _cell(m["step"]), _cell(m.get("phase")),
             f"{m['cooldown_left']:.1f}s" if m["cooldown_left"] > 0 else "-"]
            for m in members]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_COLUMNS)]
    lines = [header, ""]
    for row in ([*_COLUMNS], *rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return "\n".join(lines)


def _newest(events: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((e for e in reversed(events) if e.get("event") == name), None)


_FAULT_EVENTS = ("fault", "rollback", "recovered")


def last_fault_events(log_dir: Path) -> list[dict[str, Any]]:
    """The newest ``fault`` event and the ``rollback``/``recovered`` events after it, in file order, read
    backwards from the end of ``events.jsonl``, not the job's whole history."""
    found = []
    for event in newest_events(log_dir, _FAULT_EVENTS):
        found.append(event)
        if event["event"] == "fault":
            break
    return found[::-1]


def describe_last_fault(events: list[dict[str, Any]], now: float | None = None) -> str:
    """One line on the newest ``fault`` event and the recovery that followed it, if any."""
    now = time.time() if now is None else now
    fault = _newest(events, "fault")
    if fault is None:
        return "last fault: none"
    after = events[events.index(fault) + 1:]
    line = (f"last fault: rank {_cell(fault.get('rank'))} cause={fault.get('cause')} "
            f"{now - fault['ts']:.0f}s ago")
    recovered, rollback = _newest(after, "recovered"), _newest(after, "rollback")
    if recovered is not None:
        line += f"; recovered in {recovered['seconds']:.1f} s"
    elif rollback is not None:
        line += f"; rolled back to step {rollback['step']}"
    else:
        return line + "; not recovered yet"
    source = (recovered or {}).get("source") or (rollback or {}).get("source")
    return line + ("" if source is None else f" (source {source})")


def status(
    log_dir: Annotated[Path, typer.Option("--log_dir", "--log-dir",
                                          help="The job's log dir (tftrun's --log_dir).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the scheduler's raw answer "
                                          "as JSON.")] = False,
) -> None:
    """Print the membership table of the job running with LOG_DIR; exit 1 if none is."""
    answer = query(log_dir)
    if as_json:
        typer.echo(json.dumps(answer, indent=1))
        return
    typer.echo(format_status(answer))
    typer.echo(describe_last_fault(last_fault_events(log_dir)))
