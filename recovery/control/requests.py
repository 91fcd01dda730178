"""What a signed request's body may hold: every request the scheduler accepts is checked here.

A verified signature does not make a body trusted (a client's bug or a user's script may send
anything). Fields beyond its op's schema are ignored; a failure is a :class:`BadRequest`, answered
``bad_request`` before anything is decided.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from recovery.control.rpc import Op
from recovery.control.signing import Sealed

__all__ = ["BadRequest", "Request", "parse_request", "MAX_REQUEST_BYTES", "MAX_DEPTH",
           "NODE_BEAT_RANKS"]

MAX_REQUEST_BYTES = 16_384
MAX_DEPTH = 4
_INT64 = 2**63 - 1
_NAME = 256
"""Characters of a name: node id, host, fault."""
_TEXT = 4096
"""Characters of free text: a reason, a phase."""
Quick = tuple[type, bool, int, int, tuple[str, ...] | None]
"""What a field's quick test takes (:meth:`Records._quickly`): its exact type, whether it
may be null, its bounds (an integer's range, a string's length), its choices."""


class BadRequest(ValueError):
    """A signed request whose body is not one of its op's."""


class _NotFinite:
    """What NaN, Infinity or an overflowing number parse to: no field's type."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Int:
    low: int = -_INT64
    high: int = _INT64
    optional: bool = False

    @property
    def quick(self) -> Quick:
        return int, self.optional, self.low, self.high, None

    def check(self, name: str, value: Any) -> int | None:
        if value is None and self.optional:
            return None
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if type(value) is not int or not self.low <= value <= self.high:
            raise BadRequest(f"{name} must be an integer in [{self.low}, {self.high}]"
                             f"{' or null' if self.optional else ''}, not {_show(value)}")
        return value


@dataclass(frozen=True)
class Text:
    length: int = _NAME
    optional: bool = False

    @property
    def quick(self) -> Quick:
        return str, self.optional, 0, self.length, None

    def check(self, name: str, value: Any) -> str | None:
        if value is None and self.optional:
            return None
        if not isinstance(value, str) or len(value) > self.length or not _encodable(value):
            raise BadRequest(f"{name} must be a string of at most {self.length} characters"
                             f"{' or null' if self.optional else ''}, not {_show(value)}")
        return value


@dataclass(frozen=True)
class Real:
    """A finite number in [``low``, ``high``]."""

    low: float
    high: float
    optional: bool = False

    def check(self, name: str, value: Any) -> float | None:
        if value is None and self.optional:
            return None
        if type(value) not in (int, float) or not self.low <= value <= self.high:
            raise BadRequest(f"{name} must be a number in [{self.low:g}, {self.high:g}]"
                             f"{' or null' if self.optional else ''}, not {_show(value)}")
        return float(value)


@dataclass(frozen=True)
class Flag:
    optional: bool = False

    @property
    def quick(self) -> Quick:
        return bool, self.optional, 0, 0, None

    def check(self, name: str, value: Any) -> bool | None:
        if value is None and self.optional:
            return None
        if not isinstance(value, bool):
            raise BadRequest(f"{name} must be true or false"
                             f"{' or null' if self.optional else ''}, not {_show(value)}")
        return value


@dataclass(frozen=True)
class Records:
    """A list of at most ``most`` objects, each with the fields of ``schema``."""

    schema: dict[str, Int | Text | Flag | Choice]
    most: int

    @cached_property
    def _quick(self) -> tuple[tuple[Any, ...], ...]:
        """Each field's name and :data:`Quick`."""
        return tuple((field, *kind.quick) for field, kind in self.schema.items())

    def check(self, name: str, value: Any, surrogates: bool = True) -> list[dict[str, Any]]:
        """The items of ``value``, each with exactly the schema's fields. ``surrogates=False`` (no
        ``\\u`` escape in the text, so no lone surrogate) lets each item take the cheap
        :meth:`_quickly` first; only one that fails it gets the full check, for its error."""
        if not isinstance(value, list) or not 1 <= len(value) <= self.most \
                or not all(isinstance(item, dict) for item in value):
            raise BadRequest(f"{name} must be a list of 1 to {self.most} objects, "
                             f"not {_show(value)}")
        checked = []
        for index, item in enumerate(value):
            fields = None if surrogates else self._quickly(item)
            if fields is not None:
                checked.append(fields)
                continue
            try:  # the item's place is named only in an error: thousands pass each second
                checked.append({field: kind.check(field, item.get(field))
                                for field, kind in self.schema.items()})
            except BadRequest as err:
                raise BadRequest(f"{name}[{index}].{err}") from None
        return checked

    def _quickly(self, item: dict[str, Any]) -> dict[str, Any] | None:
        """The item's fields when each is plainly of its kind (its exact type and in bounds, or null
        where allowed); ``None``: the full check is to decide. Inline, with no call per field: this is
        most of the cost of reading a node's beat."""
        get = item.get
        fields = {}
        for field, exact, optional, low, high, choices in self._quick:
            value = get(field)
            kind = type(value)
            if kind is exact:
                if (kind is int and not low <= value <= high) \
                        or (kind is str and (len(value) > high
                                             or (choices is not None and value not in choices))):
                    return None
            elif value is not None or not optional:
                return None
            fields[field] = value
        return fields


@dataclass(frozen=True)
class Ints:
    """A list of 1 to ``most`` integers, none negative."""

    most: int

    def check(self, name: str, value: Any) -> list[int]:
        if not isinstance(value, list) or not 1 <= len(value) <= self.most:
            raise BadRequest(f"{name} must be a list of 1 to {self.most} integers, "
                             f"not {_show(value)}")
        item = Int(low=0)
        return [item.check(f"{name}[{index}]", v) for index, v in enumerate(value)]


@dataclass(frozen=True)
class Choice:
    """One of a few strings."""

    choices: tuple[str, ...]

    @property
    def quick(self) -> Quick:
        return str, False, 0, max(map(len, self.choices)), self.choices

    def check(self, name: str, value: Any) -> str:
        if value not in self.choices:
            raise BadRequest(f"{name} must be one of {', '.join(self.choices)}, "
                             f"not {_show(value)}")
        return value


Field = Int | Real | Text | Flag | Records | Ints

_IDENTITY: dict[str, Field] = {
    "node_id": Text(optional=True), "pid": Int(low=0), "incarnation": Int(low=0),
    "host": Text(optional=True), "rank": Int(optional=True),
}
_BEAT: dict[str, Field] = {**_IDENTITY, "step": Int(optional=True),
                           "phase": Text(_TEXT, optional=True), "ready": Flag(optional=True),
                           "step_us": Int(low=0, optional=True), "steps": Int(low=1, optional=True),
                           "urgent": Flag(optional=True)}
"""``step_us`` and ``steps``: the median compute time (microseconds) of the steps since
the rank's last beat, and their count; ``urgent``: sent at once (the rank's first steps, or a
change of its own pace) (recovery/control/stragglers.py)."""
NODE_BEAT_RANKS = 64
"""At most this many ranks in one ``node_beat`` (a node with more sends several)."""
_NODE_RANK_BEAT: dict[str, Int | Text | Flag | Choice] = {
    **_BEAT, "op": Choice((Op.REGISTER.value, Op.HEARTBEAT.value)),
    "age": Int(low=0, high=86_400_000), "whole": Flag(optional=True)}
"""One rank in a ``node_beat``: what its own register or heartbeat would carry, and how
long ago (ms) its supervisor last heard from it. ``whole`` (a registration): the process
trains in whole generations only (``@recovery.restartable``), so no cooldown keeps it out."""
RETIRE_RANKS = 4096
"""At most this many ranks in one ``retire`` (a supervisor retires a node's ranks at once)."""
_ENDED: dict[str, Field] = {
    "node_id": Text(), "rank": Int(optional=True), "pid": Int(low=0), "incarnation": Int(low=0),
    "abnormal": Flag(), "reason": Text(_TEXT, optional=True),
}
SCHEMAS: dict[Op, dict[str, Field]] = {
    Op.TICK: {},
    Op.STATUS: {"first_rank": Int(low=0, optional=True), "nproc": Int(low=1, optional=True),
                "missing": Flag(optional=True)},
    Op.REGISTER: {**_IDENTITY, "ready": Flag(optional=True), "whole": Flag(optional=True)},
    Op.HEARTBEAT: _BEAT,
    Op.NODE_BEAT: {"node": Text(), "ranks": Records(_NODE_RANK_BEAT, NODE_BEAT_RANKS)},
    Op.LEAVE: _ENDED,
    Op.EXIT: _ENDED,
    Op.INJECT: {"rank": Int(), "fault": Text(), "at_step": Int(optional=True),
                "factor": Real(1.0, 1000.0, optional=True)},
    Op.LAST_WORDS: {"rank": Int(), "generation": Int(), "step": Int(),
                    "consistent": Flag(), "reason": Text(_TEXT, optional=True)},
    Op.NODE_RANK: {"node_id": Text(), "nproc": Int(low=1)},
    Op.RETIRE: {"retired": Ints(RETIRE_RANKS), "reason": Text(_TEXT)},
    Op.JOB: {},
    Op.PEER_FAILED: {"rank": Int(), "generation": Int(), "cause": Text(_TEXT, optional=True)},
}
"""The fields of each op; an optional field left out is ``None``."""


@dataclass(frozen=True)
class Request:
    """A checked request: ``fields`` holds exactly its op's fields, each of its type."""

    op: Op
    rid: str
    fields: dict[str, Any]


def parse_request(sealed: Sealed) -> Request:
    """The request in ``sealed`` (its signature verified); raises BadRequest for anything else."""
    raw = sealed.body
    try:
        op = Op(sealed.op)
    except ValueError:
        raise BadRequest(f"unknown op {_show(sealed.op)}") from None
    if len(raw) > MAX_REQUEST_BYTES:
        raise BadRequest(f"{op.value}: larger than {MAX_REQUEST_BYTES} bytes")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise BadRequest(f"{op.value}: not UTF-8") from None
    deep = BadRequest(f"{op.value}: nested deeper than {MAX_DEPTH}")
    # No deeper than its brackets, strings' included: a heartbeat's case, never walked.
    shallow = text.count("[") + text.count("{") <= MAX_DEPTH
    try:
        data = _DECODER.decode(text)
    except RecursionError:  # nested deeper than Python's recursion limit
        raise deep from None
    except ValueError as err:  # JSONDecodeError, an integer of too many digits
        raise BadRequest(f"{op.value}: not JSON: {err}") from None
    # Too deep is reported before any other error; a body of only its op's fields (a node's
    # beat) nests no deeper than they do and is never walked.
    if not isinstance(data, dict):
        raise deep if not shallow and _deeper_than(MAX_DEPTH, data) else \
            BadRequest(f"{op.value}: not a JSON object")
    schema = SCHEMAS[op]
    surrogates = "\\u" in text
    try:
        fields = {name: kind.check(name, data.get(name), surrogates) if isinstance(kind, Records)
                  else kind.check(name, data.get(name)) for name, kind in schema.items()}
    except BadRequest as err:
        raise deep if not shallow and _deeper_than(MAX_DEPTH, data) else \
            BadRequest(f"{op.value}: {err}") from None
    if not shallow and not _only_fields(schema, data) and _deeper_than(MAX_DEPTH, data):
        raise deep
    return Request(op, sealed.rid, fields)


def _only_fields(schema: dict[str, Field], data: dict[str, Any]) -> bool:
    """Whether ``data``, whose fields passed their checks, holds nothing but its op's
    fields, and each record of a list of them nothing but its own: it then nests no
    deeper than they do (a list of objects of plain values: 3, within :data:`MAX_DEPTH`)."""
    return data.keys() <= schema.keys() and all(
        item.keys() <= kind.schema.keys() for name, kind in schema.items() if isinstance(kind, Records)
        for item in data[name])


def _deeper_than(limit: int, data: Any) -> bool:
    """Whether the arrays and objects of the parsed JSON ``data`` nest deeper than
    ``limit``: walked a level at a time, containers only."""
    level = [data] if isinstance(data, (dict, list)) else []
    for _depth in range(limit):
        level = [child for node in level for child in (node.values() if isinstance(node, dict)
                                                       else node)
                 if isinstance(child, (dict, list))]
        if not level:
            return False
    return True


def _number(text: str) -> float | _NotFinite:
    value = float(text)
    return value if math.isfinite(value) else _NotFinite(text)


_DECODER = json.JSONDecoder(parse_constant=_NotFinite, parse_float=_number)
"""``json.loads`` with these hooks makes a decoder for every call."""


def _encodable(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (JSON may carry lone surrogates)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
