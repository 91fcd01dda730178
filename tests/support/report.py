"""Checks shared by the report tests: the trace-event format, and the SVG's elements."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

PHASES = {"X", "B", "E", "i", "M"}


def _check_nesting(spans: list[dict[str, Any]]) -> None:
    """Complete events of one thread nest or follow each other, never overlap partly."""
    open_ends: list[int] = []
    for span in sorted(spans, key=lambda s: (s["ts"], -s["dur"])):
        while open_ends and open_ends[-1] <= span["ts"]:
            open_ends.pop()
        end = span["ts"] + span["dur"]
        assert not open_ends or end <= open_ends[-1], f"{span} overlaps its parent partly"
        open_ends.append(end)


def check_trace(trace: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Assert that ``trace`` follows the trace-event format: a ``traceEvents`` list, known
    ``ph``, integer ``ts`` (µs) and ``dur``, every ``B`` matched by an ``E`` on its thread,
    complete events nested. Returns each thread's complete events."""
    entries = trace["traceEvents"]
    assert isinstance(entries, list) and entries
    by_thread: dict[tuple[int, int], list[dict[str, Any]]] = {}
    begun: dict[tuple[int, int], list[str]] = {}
    for entry in entries:
        assert entry["ph"] in PHASES, entry
        assert isinstance(entry["pid"], int) and isinstance(entry["tid"], int), entry
        if entry["ph"] == "M":
            continue
        assert isinstance(entry["ts"], int) and entry["ts"] >= 0, entry
        thread = (entry["pid"], entry["tid"])
        if entry["ph"] == "X":
            assert isinstance(entry["dur"], int) and entry["dur"] >= 0, entry
            by_thread.setdefault(thread, []).append(entry)
        elif entry["ph"] == "B":
            begun.setdefault(thread, []).append(entry["name"])
        elif entry["ph"] == "E":
            assert begun.get(thread), f"an end without a begin: {entry}"
            begun[thread].pop()
        else:
            assert entry["s"] in {"t", "p", "g"}, entry
    assert not any(begun.values()), f"begins without an end: {begun}"
    for spans in by_thread.values():
        _check_nesting(spans)
    return by_thread


class SvgElements(HTMLParser):
    """The elements of a report that carry a class, with their attributes."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []
        self.tags: set[str] = set()
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        fields = {k: v or "" for k, v in attrs}
        for name in fields.get("class", "").split():
            self.found.append((name, fields))

    def of(self, name: str) -> list[dict[str, str]]:
        return [fields for kind, fields in self.found if kind == name]
