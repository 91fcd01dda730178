"""Which events a report may draw: each field it reads of the type it draws it as. A log dir may be shared and
its report opened by others, so an event with a field of another type (a ``pid`` that is markup, a ``ts`` of
``NaN``) is left out whole, and what is drawn is escaped too."""

from __future__ import annotations

from typing import Any

__all__ = ["well_typed", "drawable"]

_INTEGERS = frozenset({"node_rank", "pid", "rank", "incarnation", "exitcode", "generation",
                       "world", "step", "total", "since"})
_REALS = frozenset({"ts", "seconds", "until"})
"""Unix times and durations in seconds."""
_TEXTS = frozenset({"event", "run_id", "role", "signal", "cause", "what", "why",
                    "params_sha256", "source", "reason"})
_INTEGER_LISTS = frozenset({"active"})
_REQUIRED = {"spawn": ("pid",), "exit": ("pid",), "hang": ("rank", "pid"),
             "generation": ("generation",), "membership": ("generation",),
             "step": ("rank", "step"), "train_end": ("rank", "step"), "cooldown": ("until",),
             "straggler": ("rank",)}
"""The fields an event's drawing cannot do without, besides ``ts``."""
_INT_LIMIT = 1 << 63
_REAL_LIMIT = 1e11
"""Past the year 5000 as a unix time: the drawings' arithmetic and clock stay finite."""


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -_INT_LIMIT <= value < _INT_LIMIT


def _real(value: object) -> bool:
    """A finite number within the limit (``NaN`` and infinities compare false)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and abs(value) <= _REAL_LIMIT)


def _field_ok(name: str, value: object) -> bool:
    if value is None:
        return True
    if name in _INTEGERS:
        return _integer(value)
    if name in _REALS:
        return _real(value)
    if name in _TEXTS:
        return isinstance(value, str)
    if name in _INTEGER_LISTS:
        return isinstance(value, list) and all(_integer(item) for item in value)
    return True  # not read, or read only for its truth (``expected``, ``retired``)


def well_typed(event: Any) -> bool:
    """Whether every field the report reads of ``event`` (a parsed line of ``events.jsonl``) has its type."""
    if not isinstance(event, dict) or not _real(event.get("ts")):
        return False
    return all(_field_ok(name, value) for name, value in event.items())


def drawable(event: dict[str, Any]) -> bool:
    """Whether a well-typed ``event`` holds every field its drawing needs."""
    return all(event.get(name) is not None for name in _REQUIRED.get(str(event.get("event")), ()))
