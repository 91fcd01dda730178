"""The self-contained HTML report: svg.py's drawings and the summary tables. Inline CSS and SVG, no script
and no outside link, so the one file can be mailed or opened without network."""

from __future__ import annotations

import time
from collections.abc import Sequence

from launcher.report.model import Timeline
from launcher.report.svg import escape_text, steps_svg, timeline_svg

__all__ = ["render_html"]

_STYLE = """
body { font-family: sans-serif; margin: 24px; color: #263238; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 22px 0 6px; }
.meta { color: #546e7a; font-size: 13px; margin-bottom: 8px; }
table { border-collapse: collapse; font-size: 13px; margin-top: 4px; }
th, td { border: 1px solid #cfd8dc; padding: 4px 10px; text-align: left; }
th { background: #eceff1; } td.num { text-align: right; }
.ok { color: #2e7d32; font-weight: 600; } .bad { color: #c62828; font-weight: 600; }
code { font-size: 12px; }
"""


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} s"


def _cell(value: object, numeric: bool = False) -> str:
    text = "–" if value is None else escape_text(str(value))
    return f'<td class="num">{text}</td>' if numeric else f"<td>{text}</td>"


def _state(timeline: Timeline) -> str:
    if timeline.ended:
        verdict = "ok" if timeline.exitcode == 0 else "bad"
        return (f'ended, exit status <span class="{verdict}">{timeline.exitcode}</span> '
                f"({escape_text(timeline.reason)})")
    if timeline.running:
        return "still running: this is what is known so far"
    return "no job_end recorded: tftrun itself was stopped, or these are not all the events"


def _faults_table(timeline: Timeline) -> str:
    rows = []
    number = 0
    for recovery in timeline.recoveries:
        for fault in recovery.faults:
            number += 1
            took = None if recovery.end is None else recovery.end - fault.ts
            node = timeline.node_of(fault.rank) if fault.rank is not None else None
            rows.append(
                "<tr>" + _cell(number, True) + _cell(_seconds(fault.ts - timeline.start), True)
                + _cell(fault.rank, True) + _cell(node, True) + _cell(fault.cause)
                + _cell(recovery.source or ("–" if recovery.end is not None else
                                            "recovering" if timeline.running else
                                            "no recovered event"))
                + _cell(_seconds(took), True) + _cell(recovery.global_step, True)
                + _cell(recovery.steps_redone, True) + _cell(recovery.restart) + "</tr>")
    if not rows:
        return "<p>No faults.</p>"
    head = ("<tr><th>#</th><th>at</th><th>rank</th><th>node</th><th>cause</th>"
            "<th>recovered from</th><th>recovery time</th><th>went on from step</th>"
            "<th>steps redone</th><th>tftrun restarted</th></tr>")
    return f'<table class="faults">{head}{"".join(rows)}</table>'


def _totals_table(timeline: Timeline) -> str:
    redone = [r.steps_redone for r in timeline.recoveries if r.steps_redone is not None]
    job_time = timeline.end - timeline.start
    rows = [("faults", len(timeline.faults)),
            ("steps redone", sum(redone) if redone else "–"),
            ("restarts of all workers", timeline.restarts),
            ("relaunches of single ranks", timeline.relaunches),
            ("job time", _seconds(job_time) + ("" if timeline.ended else " so far"))]
    body = "".join(f"<tr><th>{name}</th>{_cell(value, True)}</tr>" for name, value in rows)
    return f'<table class="totals">{body}</table>'


def _digests_table(timeline: Timeline) -> str:
    if not timeline.digests:
        return "<p>No rank has ended its training yet (no <code>train_end</code> event).</p>"
    agree = timeline.digests_agree
    verdict = ('<p class="ok">Every rank ended with the same parameters.</p>' if agree else
               '<p class="bad">The ranks ended with different parameters.</p>')
    rows = "".join(f"<tr>{_cell(rank, True)}<td><code>{escape_text(digest)}</code></td></tr>"
                   for rank, digest in timeline.digests.items())
    return (f'{verdict}<table class="digests"><tr><th>rank</th><th>final params_sha256</th>'
            f"</tr>{rows}</table>")


def render_html(timeline: Timeline, log_dirs: Sequence[str]) -> str:
    """The report of ``timeline``, read from ``log_dirs``, as one HTML document."""
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timeline.start))
    title = f"tftrun report: {timeline.run_id or 'job'}"
    read_from = escape_text(", ".join(log_dirs)) + (
        f'; <span class="bad">{timeline.left_out} events left out</span> (a field not of its type)'
        if timeline.left_out else "")
    steps = (steps_svg(timeline) if timeline.steps else
             "<p>No steps reported (the script does not use <code>ElasticTrainer</code>, or "
             "has not completed a step yet).</p>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape_text(title)}</title>
<style>{_STYLE}</style></head>
<body>
<h1>{escape_text(title)}</h1>
<div class="meta">started {started}; {_state(timeline)}; read from {read_from}</div>
<h2>Timeline</h2>
{timeline_svg(timeline)}
<h2>Steps over time</h2>
{steps}
<h2>Summary</h2>
{_totals_table(timeline)}
<h2>Faults</h2>
{_faults_table(timeline)}
<h2>Final parameters</h2>
{_digests_table(timeline)}
</body></html>
"""
