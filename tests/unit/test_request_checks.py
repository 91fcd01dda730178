"""The checks of a request's body (recovery/control/requests.py): the quick path a node's
beat takes gives what the full check gives, and nesting is refused however it is hidden."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.control.requests import MAX_DEPTH, SCHEMAS, BadRequest, _deeper_than, parse_request
from recovery.control.rpc import Op
from recovery.control.signing import Kind, job_key, new_nonce, seal, unseal
from recovery.env import DEFAULT_RUN_ID

KEY = job_key("job-token", DEFAULT_RUN_ID, "")
RANKS = SCHEMAS[Op.NODE_BEAT]["ranks"]

values = (st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.text(max_size=8)
          | st.text(min_size=250, max_size=300) | st.sampled_from([1.0, 2.5, math.inf, -0.0])
          | st.sampled_from(["register", "heartbeat", "\ud800"]) | st.lists(st.integers(), max_size=2))
items = st.dictionaries(st.sampled_from(["op", "node_id", "pid", "incarnation", "host", "rank",
                                         "step", "phase", "ready", "age", "other"]),
                        values, max_size=11)


def outcome(check: Any) -> Any:
    try:
        return check()
    except BadRequest as err:
        return f"refused: {err}"


@settings(max_examples=400, deadline=None)
@given(ranks=st.lists(items, min_size=1, max_size=4))
def test_the_quick_check_of_a_node_beats_ranks_gives_what_the_full_check_gives(
        ranks: list[dict[str, Any]]) -> None:
    """Whatever the values (wrong types, out of range, integral floats, lone surrogates
    where the text would have a \\u escape), the quick path accepts an item exactly when
    the full check does, with the same fields, and refuses with the same error."""
    full = outcome(lambda: RANKS.check("ranks", ranks))
    has_surrogate = any(isinstance(v, str) and "\ud800" in v for item in ranks for v in item.values())
    if has_surrogate:  # such a text has a \u escape: the quick path is not taken
        return
    assert outcome(lambda: RANKS.check("ranks", ranks, surrogates=False)) == full


WHOLE_TABLE = {"first_rank": None, "nproc": None, "missing": None}
"""A ``status`` without a scope: ``tftctl status``'s."""


def parsed(body: str, op: Op = Op.STATUS) -> Any:
    sealed = unseal(KEY, Kind.REQUEST, seal(KEY, Kind.REQUEST, op.value, "r1", new_nonce(), body))
    return outcome(lambda: parse_request(sealed).fields)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 50, 2500])  # 2500: past the recursion limit
@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_a_body_nested_deeper_than_allowed_is_refused_even_in_a_field_nobody_reads(
        depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    inner = depth - 1  # the body's own object is one level
    assert parsed(f'{{"x": {opener * inner}1{closer * inner}}}') == \
        f"refused: status: nested deeper than {MAX_DEPTH}"


def test_a_body_nested_as_deep_as_allowed_is_read() -> None:
    assert parsed('{"x": [[[1]]]}') == WHOLE_TABLE
    ranks = [{"op": "heartbeat", "pid": 1, "incarnation": 2, "age": 0, "x": [1]}]
    fields = parsed(json.dumps({"node": "h/0", "ranks": ranks}), Op.NODE_BEAT)
    assert fields["ranks"][0]["pid"] == 1 and "x" not in fields["ranks"][0]


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    assert parsed(json.dumps({"x": "[[[[[[{{{{{{"})) == WHOLE_TABLE


def test_a_node_status_names_its_ranks_and_nothing_out_of_range_passes() -> None:
    """``status`` with a scope (a node's supervisor); without one, the whole table."""
    assert parsed(json.dumps({"first_rank": 8, "nproc": 8, "missing": True})) == \
        {"first_rank": 8, "nproc": 8, "missing": True}
    assert parsed(json.dumps({"first_rank": -1, "nproc": 8})).startswith(
        "refused: status: first_rank must be an integer in [0, ")
    assert parsed(json.dumps({"first_rank": 0, "nproc": 0})).startswith(
        "refused: status: nproc must be an integer in [1, ")
    assert parsed(json.dumps({"nproc": 1, "missing": 1})) == \
        "refused: status: missing must be true or false or null, not 1"


nested = st.recursive(st.integers(0, 3) | st.text(max_size=2),
                      lambda inner: st.lists(inner, max_size=2)
                      | st.dictionaries(st.text(max_size=2), inner, max_size=2), max_leaves=6)
VALID_RANK = {"op": "heartbeat", "node_id": "0", "pid": 1, "incarnation": 0, "host": "h",
              "rank": None, "step": 3, "phase": "train", "age": 0}
beat_ranks = st.lists(st.builds(lambda extra, broken: {**VALID_RANK, **extra, **broken},
                                st.dictionaries(st.sampled_from(["x", "y"]), nested, max_size=2),
                                st.dictionaries(st.sampled_from(["pid", "step"]), nested,
                                                max_size=1)
                                | st.just({})), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(ranks=beat_ranks | nested, node=st.just("h/0") | nested,
       extra=st.dictionaries(st.sampled_from(["x", "node_id"]), nested, max_size=2))
def test_a_beat_is_refused_as_nested_too_deep_exactly_when_it_is(
        ranks: Any, node: Any, extra: dict[str, Any]) -> None:
    """A beat whose fields are all of their kind and that holds nothing else is not
    walked for its depth; whatever it holds, it is refused as too deep exactly when it
    nests deeper than MAX_DEPTH, and before any other refusal."""
    body = {"node": node, "ranks": ranks, **extra}
    deep = _deeper_than(MAX_DEPTH, body)
    result = parsed(json.dumps(body), Op.NODE_BEAT)
    assert (result == f"refused: node_beat: nested deeper than {MAX_DEPTH}") == deep, result
