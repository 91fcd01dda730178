"""The only module that draws: the live table, plain status lines, and the final summary. On a terminal, a rich
live table under a progress bar; off one (CI, pipes), a timestamped line per lifecycle event and a progress
line every ``--progress_interval`` seconds."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from launcher.view.progress import EventTail, Progress, RunSpan, clock_time, progress_bar

__all__ = ["Row", "View", "make_view", "SummaryRow", "print_summary", "progress_line",
           "event_line", "run_line"]


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
    def show_rows(self, rows: list[Row]) -> None: ...
    def output(self, label: str, line: str) -> None: ...
    def close(self) -> None: ...


OUTCOMES = {"clean": "a clean exit", "stopped": "stopped by tftrun", "failed": "a failure"}
"""How an ``exit`` event's ``outcome`` reads on the console."""


def _describe(record: dict[str, Any]) -> str:
    hidden = ("ts", "event", "expected", "outcome") if record.get("event") == "exit" else (
        "ts", "event")
    fields = {k: v for k, v in record.items() if k not in hidden}
    text = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None and v != "")
    outcome = OUTCOMES.get(str(record.get("outcome")))
    return text if outcome is None else f"{text}: {outcome}"


def event_line(record: dict[str, Any]) -> str:
    """An event on the console: ``exit role=worker rank=2 pid=4242 incarnation=0 exitcode=0:
    a clean exit`` (the file keeps every field)."""
    return f"{record['event']} {_describe(record)}"


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _rate(progress: Progress, rank: int) -> str:
    known = progress.ranks.get(rank)
    return "-" if known is None or known.rate is None else f"{known.rate:.1f}"


def _step(progress: Progress, rank: int) -> str:
    known = progress.ranks.get(rank)
    return "-" if known is None else str(known.global_step)


def _state(progress: Progress, row: Row) -> str:
    """The row's state, marked when the rank is a straggler (docs/stragglers.md)."""
    return f"{row.state} (straggler)" if row.rank in progress.stragglers else row.state


def _rank_text(progress: Progress, row: Row) -> str:
    """``rank 0 step 40 12.4/s``, or its state while it has no step or waits to relaunch;
    `` straggler`` after a rank named one."""
    if row.state.startswith("cooldown") or row.rank not in progress.ranks:
        return f"rank {row.rank} {_state(progress, row)}"
    mark = " straggler" if row.rank in progress.stragglers else ""
    return (f"rank {row.rank} step {_step(progress, row.rank)} "
            f"{_rate(progress, row.rank)}/s{mark}")


def progress_line(progress: Progress, rows: list[Row]) -> str | None:
    """The plain view's progress line, e.g. ``progress [####....] 40/100 40% 12.5 steps/s ETA 0:05; rank 0 step
    40 12.4/s, ...``; None when nothing is known yet."""
    waiting = [r for r in rows if r.state.startswith("cooldown")]
    if progress.global_step is None and progress.recovering is None and not waiting:
        return None
    parts = [progress_bar(progress)]
    parts += [note for note in (progress.degraded, progress.recovering) if note]
    if len(rows) <= 8:
        parts.append(", ".join(_rank_text(progress, row) for row in rows))
    else:
        steps = [p.global_step for p in progress.ranks.values()]
        if steps:
            parts.append(f"ranks at steps {min(steps)}..{max(steps)}")
        parts += [f"rank {r.rank} {r.state}" for r in waiting]
    return "progress " + "; ".join(parts)


class PlainView:
    """One line per event: ``YYYY-MM-DD hh:mm:ss tftrun: exit role=worker rank=2 ...``,
    and a ``progress`` line every ``progress_interval`` seconds (0: never)."""

    def __init__(self, stream: Any = None, events_path: Path | None = None,
                 progress_interval: float = 0.0) -> None:
        self._stream = stream or sys.stdout
        self._tail = None if events_path is None else EventTail(events_path, catches_up=False)
        self._progress = Progress()
        self._interval = progress_interval
        self._next_line = time.monotonic() + progress_interval

    @property
    def wants_rows(self) -> bool:
        """Rows are only worth building when a progress line is due."""
        return (self._tail is not None and self._interval > 0
                and time.monotonic() >= self._next_line)

    def _print(self, text: str) -> None:
        print(text, file=self._stream, flush=True)

    def on_event(self, record: dict[str, Any]) -> None:
        self._print(f"{_stamp(record['ts'])} tftrun: {event_line(record)}")

    def show_rows(self, rows: list[Row]) -> None:
        if self._tail is None:
            return
        self._next_line = time.monotonic() + self._interval
        self._progress.feed(self._tail.read())
        line = progress_line(self._progress, rows)
        if line is not None:
            self._print(f"{_stamp(time.time())} tftrun: {line}")

    def output(self, label: str, line: str) -> None:
        self._print(f"[{label}] {line}")

    def close(self) -> None:
        return None


class LiveView:
    """A rich live table, redrawn a few times a second; events print above it."""

    wants_rows = True

    def __init__(self, console: Console, events_path: Path | None = None,
                 title: str = "tftrun") -> None:
        self._title = title
        self._console = console
        self._tail = None if events_path is None else EventTail(events_path, catches_up=False)
        self._progress = Progress()
        self._live = Live(self._table([]), console=console, refresh_per_second=4)
        self._live.start()

    def _table(self, rows: list[Row]) -> Table:
        """The ranks, one row each; the caption: progress and a recovery under way."""
        progress = self._progress
        parts = [progress_bar(progress) if progress.global_step is not None else "",
                 progress.degraded or "", progress.recovering or ""]
        caption = "  ".join(part for part in parts if part) or None
        table = Table(title=self._title, caption=None if caption is None else Text(caption),
                      expand=False)
        for column in ("rank", "pid", "state", "restarts", "step", "steps/s", "last log line"):
            table.add_column(column, no_wrap=column != "last log line", overflow="ellipsis")
        for row in rows:
            table.add_row(str(row.rank), str(row.pid or "-"), _state(progress, row),
                          str(row.restarts),
                          _step(progress, row.rank), _rate(progress, row.rank),
                          row.last_line[-100:])
        return table

    def on_event(self, record: dict[str, Any]) -> None:
        if record["event"] in ("exit", "restart", "hang", "job_end"):
            self._console.print(f"[bold]{record['event']}[/] {escape(_describe(record))}",
                                highlight=False)

    def show_rows(self, rows: list[Row]) -> None:
        if self._tail is not None:
            self._progress.feed(self._tail.read())
        self._live.update(self._table(rows))

    def output(self, label: str, line: str) -> None:
        self._console.print(f"[dim]\\[{label}][/] {line}", highlight=False, markup=True)

    def close(self) -> None:
        self._live.stop()


def make_view(events_path: Path | None = None, progress_interval: float = 0.0,
              title: str = "tftrun") -> View:
    """The live table on a terminal, else plain lines; both follow ``events_path`` for the workers' progress.
    ``title`` heads the table."""
    console = Console()
    if console.is_terminal:
        return LiveView(console, events_path, title)
    return PlainView(None, events_path, progress_interval)


def run_line(span: RunSpan, now: float, logs: str) -> str:
    """The summary's figures: ``wall time 12.3 s, final step 100 of 100, 8.2 steps/s; logs
    in /home/me/logs`` (what is known)."""
    parts = []
    if span.started is not None:  # ``8.4 s`` under a minute, else ``1:02:03`` or ``2:03``
        wall = now - span.started
        parts.append(f"wall time {wall:.1f} s" if wall < 60 else f"wall time {clock_time(wall)}")
    if span.final is not None:
        of = "" if span.total is None else f" of {span.total}"
        parts.append(f"final step {span.final}{of}")
    if span.rate is not None:
        parts.append(f"{span.rate:.1f} steps/s")
    return "; ".join(filter(None, (", ".join(parts), f"logs in {logs}")))


def print_summary(rows: list[SummaryRow], failing: str | None, failing_log: list[str],
                  root_cause: str | None, figures: str = "") -> None:
    """Print the end-of-job table, the run's ``figures``, and the failing rank's root cause: what its
    ``@record`` left (``root_cause``), else its log's last lines."""
    console = Console(width=None if sys.stdout.isatty() else 120)
    table = Table(title="tftrun summary")
    for column in ("rank", "pid", "end", "restarts"):
        table.add_column(column)
    for row in rows:
        table.add_row(str(row.rank), str(row.pid or "-"), row.end, str(row.restarts))
    console.print(table)
    if figures:
        console.print(figures, highlight=False, markup=False, soft_wrap=True)
    if failing is None:
        return
    console.print(f"Root cause (first observed failure): {failing}", highlight=False)
    error, _, traceback = (root_cause or "").partition("\n")
    if error:
        console.print(f"  error: {error}", highlight=False, markup=False)
    if traceback:
        _print_lines(console, "traceback (from its error file):", traceback.splitlines())
    elif failing_log:
        _print_lines(console, "last lines of its log:", failing_log)


def _print_lines(console: Console, heading: str, lines: list[str]) -> None:
    console.print(f"  {heading}", highlight=False)
    for line in lines:
        console.print(f"    {line}", highlight=False, markup=False, soft_wrap=True)
