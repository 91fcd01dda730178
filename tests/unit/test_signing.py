"""Signed messages (recovery/control/signing.py): only what the key signed verifies, any
change to a signed message fails, a reply never passes for a request, and a request is
accepted once, within its window. Then the refusal throttle's bound."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.control.signing import (
    BadSignature,
    Kind,
    MissingToken,
    ReplayGuard,
    checked_token,
    new_nonce,
    seal,
    unseal,
)
from recovery.control.throttle import Throttle

KEY = b"f0e1d2c3b4a5968778695a4b3c2d1e0f"

ops = st.from_regex(r"[a-z_]{1,32}", fullmatch=True)
rids = st.from_regex(r"[0-9A-Za-z_-]{1,64}", fullmatch=True)
nonces = st.from_regex(r"[0-9a-f]{32}", fullmatch=True)
bodies = st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=20) | st.none(),
                         max_size=4).map(json.dumps)
keys = st.binary(min_size=0, max_size=40)


@settings(max_examples=100, deadline=None)
@given(key=keys, kind=st.sampled_from(Kind), op=ops, rid=rids, nonce=nonces, body=bodies)
def test_what_a_key_signed_verifies_with_it_and_with_no_other(
        key: bytes, kind: Kind, op: str, rid: str, nonce: str, body: str) -> None:
    raw = seal(key, kind, op, rid, nonce, body)
    sealed = unseal(key, kind, raw)
    assert (sealed.op, sealed.rid, sealed.nonce, sealed.body) == (op, rid, nonce, body.encode())
    assert key not in raw.encode() or len(key) < 8  # the key itself is not in the message
    with pytest.raises(BadSignature):
        unseal(key + b"x", kind, raw)
    other = Kind.REPLY if kind is Kind.REQUEST else Kind.REQUEST
    with pytest.raises(BadSignature):
        unseal(key, other, raw)


@settings(max_examples=200, deadline=None)
@given(op=ops, rid=rids, body=bodies, data=st.data())
def test_any_change_to_a_signed_message_fails_its_check(
        op: str, rid: str, body: str, data: st.DataObject) -> None:
    raw = bytearray(seal(KEY, Kind.REQUEST, op, rid, new_nonce(), body).encode())
    at = data.draw(st.integers(0, len(raw) - 1), label="at")
    raw[at] = (raw[at] + data.draw(st.integers(1, 255), label="delta")) % 256
    cut = data.draw(st.booleans(), label="also truncated")
    tampered = bytes(raw[:-1] if cut and len(raw) > 1 else raw)
    with pytest.raises(BadSignature):
        unseal(KEY, Kind.REQUEST, tampered)


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=300) | st.text(max_size=300))
def test_any_bytes_are_refused_without_raising_anything_else(raw: bytes | str) -> None:
    with pytest.raises(BadSignature):
        unseal(KEY, Kind.REQUEST, raw)


def test_an_unsigned_message_is_refused_with_its_header_to_answer_it() -> None:
    raw = seal(None, Kind.REPLY, "register", "r1", new_nonce(), '{"reason": "token"}')
    with pytest.raises(BadSignature) as refused:
        unseal(KEY, Kind.REPLY, raw)
    assert refused.value.header is not None and refused.value.header.rid == "r1"
    assert not refused.value.header.signed


def test_a_request_is_accepted_once_within_its_window_and_never_after() -> None:
    guard = ReplayGuard(window=10.0)
    now = 1_000_000_000
    sealed = unseal(KEY, Kind.REQUEST, seal(KEY, Kind.REQUEST, "exit", "r", new_nonce(), "{}",
                                            ts_ms=now))
    assert guard.check(sealed, now_ms=now) is None
    assert guard.check(sealed, now_ms=now + 5_000) == "replayed"
    assert guard.check(sealed, now_ms=now + 10_001) == "stale"  # and forgotten
    assert len(guard) == 0
    ahead = unseal(KEY, Kind.REQUEST, seal(KEY, Kind.REQUEST, "exit", "r", new_nonce(), "{}",
                                           ts_ms=now + 9_000))  # a clock ahead of ours
    assert guard.check(ahead, now_ms=now) is None
    assert guard.check(ahead, now_ms=now + 18_000) == "replayed"  # remembered as long


def test_the_throttle_reports_once_per_interval_with_the_count_held_back() -> None:
    clock = [0.0]
    throttle = Throttle(every=10.0, clock=lambda: clock[0])
    reports = [throttle.note() for _ in range(1000)]
    assert reports[0] == 1 and reports[1:] == [None] * 999
    assert throttle.due() is None
    assert throttle.next_due() == 10.0  # a sleeping scheduler wakes for the held-back report
    clock[0] = 10.0
    assert throttle.due() == 999 and throttle.due() is None
    assert throttle.next_due() is None


def test_an_empty_token_is_refused_unless_the_user_opts_in() -> None:
    with pytest.raises(MissingToken, match="TFT_INSECURE_NO_TOKEN=1"):
        checked_token("", insecure_no_token=False)
    assert checked_token("", insecure_no_token=True) == ""
    assert checked_token("s3cret", insecure_no_token=False) == "s3cret"
