"""``tftctl report --log_dir DIR [--log_dir DIR2 ...] [-o FILE] [--format html|trace]``: a job's timeline as
a self-contained HTML page or a Chrome trace-event JSON, drawn up to now for a job still running."""

from __future__ import annotations

import json
import time
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from launcher.errors import ConfigError
from launcher.report.page import render_html
from launcher.report.sources import job_is_running, read_job
from launcher.report.timeline import build_timeline
from launcher.report.trace import trace_events

__all__ = ["report", "Format"]


class Format(str, Enum):
    HTML = "html"
    TRACE = "trace"


_DEFAULT_OUTPUT = {Format.HTML: "report.html", Format.TRACE: "trace.json"}


def report(
    log_dirs: Annotated[list[Path], typer.Option(
        "--log_dir", "--log-dir", help="A log dir of the job (tftrun's --log_dir), or an "
        "archived run (LOG_DIR/previous/N); repeat it for each node.")],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", help="The file to write. [default: report.html, or trace.json "
        "with --format trace]", show_default=False)] = None,
    form: Annotated[Format, typer.Option(
        "--format", help="html: a self-contained page; trace: Chrome trace-event JSON "
        "(Perfetto, chrome://tracing).", case_sensitive=False)] = Format.HTML,
) -> None:
    """Write the timeline of the job that logged to LOG_DIR(s): faults, recoveries, steps."""
    events = read_job(log_dirs)
    if not events:
        raise ConfigError(f"no events in {', '.join(map(str, log_dirs))}")
    # A running job's timeline ends now; an ended one's at its last event.
    timeline = build_timeline(events, time.time() if job_is_running(events) else None)
    target = output if output is not None else Path(_DEFAULT_OUTPUT[form])
    if form is Format.TRACE:
        text = json.dumps(trace_events(timeline), indent=None)
    else:
        text = render_html(timeline, [str(d) for d in log_dirs])
    try:
        target.write_text(text)
    except OSError as err:
        raise ConfigError(f"cannot write {target}: {err.strerror}") from None
    faults = len(timeline.faults)
    typer.echo(f"wrote {target}: {len(timeline.lanes)} ranks, {faults} fault"
               f"{'' if faults == 1 else 's'}, {len(timeline.recoveries)} recover"
               f"{'y' if len(timeline.recoveries) == 1 else 'ies'}"
               + ("" if timeline.ended else " (job not ended)")
               + (f"; {timeline.left_out} events left out (a field not of its type)"
                  if timeline.left_out else ""))
