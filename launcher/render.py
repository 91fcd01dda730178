"""The only module that draws: the live table, plain status lines, and the final summary.

On a terminal, a rich live table (rank, pid, state, restarts, last log line); off a
terminal (CI, pipes), one timestamped line per lifecycle event.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Protocol

from rich.console import Console
from rich.live import Live
from rich.table import Table

__all__ = ["Row", "View", "make_view", "SummaryRow", "print_summary"]


@dataclass(frozen=True)
class Row:
    rank: int
    pid: int | None
    state: str
    restarts: int
    last_line: str


@dataclass(frozen=True)
class SummaryRow:
    rank: int
    pid: int | None
    end: str
    restarts: int


class View(Protocol):
    wants_rows: bool

    def on_event(self, record: dict[str, Any]) -> None: ...
    def show_rows(self, rows: list[Row], caption: str = "") -> None: ...
    def output(self, label: str, line: str) -> None: ...
    def close(self) -> None: ...


def _describe(record: dict[str, Any]) -> str:
    fields = {k: v for k, v in record.items() if k not in ("ts", "event")}
    return " ".join(f"{k}={v}" for k, v in fields.items() if v is not None and v != "")


class PlainView:
    """One line per event: ``2026-11-23 10:00:01 tftrun: exit role=worker rank=2 ...``."""

    wants_rows = False

    def __init__(self, stream: Any = None) -> None:
        self._stream = stream or sys.stdout

    def _print(self, text: str) -> None:
        print(text, file=self._stream, flush=True)

    def on_event(self, record: dict[str, Any]) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["ts"]))
        self._print(f"{stamp} tftrun: {record['event']} {_describe(record)}")

    def show_rows(self, rows: list[Row], caption: str = "") -> None:
        return None

    def output(self, label: str, line: str) -> None:
        self._print(f"[{label}] {line}")

    def close(self) -> None:
        return None


class LiveView:
    """A rich live table, redrawn a few times a second; events print above it."""

    wants_rows = True

    def __init__(self, console: Console) -> None:
        self._console = console
        self._live = Live(self._table([], ""), console=console, refresh_per_second=4,
                          transient=False)
        self._live.start()

    @staticmethod
    def _table(rows: list[Row], caption: str) -> Table:
        """The ranks, one row each; the caption says what else runs (the warm spares)."""
        table = Table(title="tftrun", caption=caption or None, expand=False)
        for column in ("rank", "pid", "state", "restarts", "last log line"):
            table.add_column(column, no_wrap=column != "last log line", overflow="ellipsis")
        for row in rows:
            table.add_row(str(row.rank), str(row.pid or "-"), row.state, str(row.restarts),
                          row.last_line[-100:])
        return table

    def on_event(self, record: dict[str, Any]) -> None:
        if record["event"] in ("exit", "restart", "hang", "job_end"):
            self._console.print(f"[bold]{record['event']}[/] {_describe(record)}",
                                highlight=False)

    def show_rows(self, rows: list[Row], caption: str = "") -> None:
        self._live.update(self._table(rows, caption))

    def output(self, label: str, line: str) -> None:
        self._console.print(f"[dim]\\[{label}][/] {line}", highlight=False, markup=True)

    def close(self) -> None:
        self._live.stop()


def make_view() -> View:
    console = Console()
    return LiveView(console) if console.is_terminal else PlainView()


def print_summary(rows: list[SummaryRow], failing: str | None, failing_log: list[str],
                  root_cause: str | None) -> None:
    """The table printed when the job ends, and the failing rank's last log lines."""
    console = Console(width=None if sys.stdout.isatty() else 120)
    table = Table(title="tftrun summary")
    for column in ("rank", "pid", "end", "restarts"):
        table.add_column(column)
    for row in rows:
        table.add_row(str(row.rank), str(row.pid or "-"), row.end, str(row.restarts))
    console.print(table)
    if failing is not None:
        console.print(f"Root cause (first observed failure): {failing}", highlight=False)
        if root_cause:
            console.print(f"  error: {root_cause}", highlight=False, markup=False)
        if failing_log:
            console.print("  last lines of its log:", highlight=False)
            for line in failing_log:
                console.print(f"    {line}", highlight=False, markup=False)
