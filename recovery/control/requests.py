"""What a signed request's body may hold: every request the scheduler accepts is checked here.

A request reaches this module only once its signature verified (recovery/control/signing.py:
its op, id and nonce are in its header). Its body is still checked as untrusted bytes, as
a bug of a client, or a script of the user's, may send anything: at most
:data:`MAX_REQUEST_BYTES`, UTF-8, JSON nested at most :data:`MAX_DEPTH` deep (checked before
parsing: deep nesting would exhaust Python's recursion), one object, no NaN or infinity,
and for its op, every field of the right type: integers (a JSON number with an integral
value) within 64 bits and their field's range, strings of bounded length, booleans.
Fields an op does not have are ignored. What fails is a :class:`BadRequest`, answered
``bad_request`` under the request's id before anything is decided.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import accumulate
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
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?')
"""A string (to the end of the text when unterminated: linear time)."""
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


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

    def check(self, name: str, value: Any) -> str | None:
        if value is None and self.optional:
            return None
        if not isinstance(value, str) or len(value) > self.length or not _encodable(value):
            raise BadRequest(f"{name} must be a string of at most {self.length} characters"
                             f"{' or null' if self.optional else ''}, not {_show(value)}")
        return value


@dataclass(frozen=True)
class Flag:
    optional: bool = False

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

    def check(self, name: str, value: Any) -> list[dict[str, Any]]:
        if not isinstance(value, list) or not 1 <= len(value) <= self.most \
                or not all(isinstance(item, dict) for item in value):
            raise BadRequest(f"{name} must be a list of 1 to {self.most} objects, "
                             f"not {_show(value)}")
        checked = []
        for index, item in enumerate(value):
            try:  # the item's place is named only in an error: thousands pass each second
                checked.append({field: kind.check(field, item.get(field))
                                for field, kind in self.schema.items()})
            except BadRequest as err:
                raise BadRequest(f"{name}[{index}].{err}") from None
        return checked


@dataclass(frozen=True)
class Ints:
    """A list of 1 to ``most`` integers, each in [``low``, ``high``]."""

    most: int
    low: int = 0
    high: int = _INT64

    def check(self, name: str, value: Any) -> list[int]:
        if not isinstance(value, list) or not 1 <= len(value) <= self.most:
            raise BadRequest(f"{name} must be a list of 1 to {self.most} integers, "
                             f"not {_show(value)}")
        item = Int(self.low, self.high)
        return [item.check(f"{name}[{index}]", v) for index, v in enumerate(value)]


@dataclass(frozen=True)
class Choice:
    """One of a few strings."""

    choices: tuple[str, ...]

    def check(self, name: str, value: Any) -> str:
        if value not in self.choices:
            raise BadRequest(f"{name} must be one of {', '.join(self.choices)}, "
                             f"not {_show(value)}")
        return value


Field = Int | Text | Flag | Records | Ints

_IDENTITY: dict[str, Field] = {
    "node_id": Text(optional=True), "pid": Int(low=0), "incarnation": Int(low=0),
    "host": Text(optional=True), "rank": Int(optional=True),
}
_BEAT: dict[str, Field] = {**_IDENTITY, "step": Int(optional=True),
                           "phase": Text(_TEXT, optional=True), "ready": Flag(optional=True)}
NODE_BEAT_RANKS = 64
"""At most this many ranks in one ``node_beat`` (a node with more sends several)."""
_NODE_RANK_BEAT: dict[str, Int | Text | Flag | Choice] = {
    **_BEAT, "op": Choice((Op.REGISTER.value, Op.HEARTBEAT.value)),
    "age": Int(low=0, high=86_400_000)}
"""One rank in a ``node_beat``: what its own register or heartbeat would carry, and how
long ago (ms) its supervisor last heard from it."""
RETIRE_RANKS = 4096
"""At most this many ranks in one ``retire`` (a supervisor retires a node's ranks at once)."""
_ENDED: dict[str, Field] = {
    "node_id": Text(), "rank": Int(optional=True), "pid": Int(low=0), "incarnation": Int(low=0),
    "abnormal": Flag(), "reason": Text(_TEXT, optional=True),
}
SCHEMAS: dict[Op, dict[str, Field]] = {
    Op.TICK: {},
    Op.STATUS: {},
    Op.VERDICTS: {},
    Op.REGISTER: {**_IDENTITY, "ready": Flag(optional=True)},
    Op.HEARTBEAT: _BEAT,
    Op.NODE_BEAT: {"node": Text(), "ranks": Records(_NODE_RANK_BEAT, NODE_BEAT_RANKS)},
    Op.LEAVE: _ENDED,
    Op.EXIT: _ENDED,
    Op.COOLDOWN: {"node_id": Text()},
    Op.INJECT: {"rank": Int(), "fault": Text(), "at_step": Int(optional=True)},
    Op.LAST_WORDS: {"rank": Int(), "generation": Int(), "step": Int(),
                    "consistent": Flag(), "reason": Text(_TEXT, optional=True)},
    Op.NODE_RANK: {"node_id": Text(), "nproc": Int(low=1)},
    Op.RETIRE: {"retired": Ints(RETIRE_RANKS), "reason": Text(_TEXT)},
}
"""The fields of each op; an optional field left out is ``None``."""


@dataclass(frozen=True)
class Request:
    """A checked request: ``fields`` holds exactly its op's fields, each of its type."""

    op: Op
    rid: str
    fields: dict[str, Any]


def parse_request(sealed: Sealed) -> Request:
    """The request whose header and body ``sealed`` holds (its signature verified).

    Raises:
        BadRequest: anything else.
    """
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
    if _deeper_than(MAX_DEPTH, text):
        raise BadRequest(f"{op.value}: nested deeper than {MAX_DEPTH}")
    try:
        data = json.loads(text, parse_constant=_NotFinite, parse_float=_number)
    except ValueError as err:  # JSONDecodeError, an integer of too many digits
        raise BadRequest(f"{op.value}: not JSON: {err}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"{op.value}: not a JSON object")
    try:
        fields = {name: kind.check(name, data.get(name)) for name, kind in SCHEMAS[op].items()}
    except BadRequest as err:
        raise BadRequest(f"{op.value}: {err}") from None
    return Request(op, sealed.rid, fields)


def _deeper_than(limit: int, text: str) -> bool:
    """Whether the arrays and objects of the JSON ``text`` nest deeper than ``limit``."""
    if text.count("[") + text.count("{") <= limit:
        return False  # no deeper than its brackets, strings' included: a heartbeat's case
    # The brackets outside strings, found by the regex engine; only they are walked.
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return bool(brackets) and max(accumulate(1 if bracket in "[{" else -1 for bracket in brackets)) > limit


def _number(text: str) -> float | _NotFinite:
    value = float(text)
    return value if math.isfinite(value) else _NotFinite(text)


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
