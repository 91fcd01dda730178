"""Signed requests and replies: the job token is the HMAC key and never crosses the wire.

The MAC covers each message's kind, so a reply never passes for a request, and :func:`unseal` checks it
before anything reads the body (the format: docs/protocol.md). ``-`` in place of the MAC marks the
scheduler's unsigned refusal: the one answer a client holding a wrong token can read (never trusted).
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from enum import Enum

from recovery import env as names

__all__ = ["Kind", "Sealed", "BadSignature", "seal", "unseal", "new_nonce", "ReplayGuard",
           "MissingToken", "WeakToken", "checked_token", "checked_strength", "job_key",
           "sign_value", "open_value", "keyed_name", "UNSIGNED", "MAX_MESSAGE_BYTES",
           "REPLAY_WINDOW", "MIN_TOKEN_BITS", "WRONG_TOKEN", "local_proof", "local_proof_ok"]

WRONG_TOKEN = {"ok": False, "reason": "token", "retry_after": None,
               "message": "wrong job token: the request's signature does not verify"}
"""The answer to a request signed (or, on the node's beat socket, proven) with another
token than the job's: the worker is refused for good."""


def local_proof(token: str) -> str:
    """What a worker sends its node's supervisor over the beat socket to show it holds
    the job token (the socket is local: the supervisor signs what it passes on)."""
    return hashlib.sha256(b"tft-local-beat\0" + token.encode()).hexdigest()


def local_proof_ok(proof: object, token: str) -> bool:
    return isinstance(proof, str) and hmac.compare_digest(proof, local_proof(token))

MAGIC = "tft1"
UNSIGNED = "-"
MAX_MESSAGE_BYTES = 16_384 + 256
"""A request's body may be 16 KiB (recovery/control/requests.py); the header is far shorter.
A reply may be longer (a membership table grows with the job): its reader gives its own
bound to :func:`unseal`."""
REPLAY_WINDOW = 300.0
"""Seconds a request is accepted after its sender's clock stamped it (and before: clocks
of two hosts differ a little). Within it, a request is accepted once (its nonce)."""
_HEADER = re.compile(
    rb"tft1 ([0-9a-f]{64}|-) ([a-z_]{1,32}) ([0-9A-Za-z_-]{1,64}) ([0-9a-f]{32}) ([0-9]{1,16})\n")


class Kind(str, Enum):
    REQUEST = "request"
    REPLY = "reply"


@dataclass(frozen=True)
class Sealed:
    """A message whose MAC verified (or, ``signed`` false, an unsigned refusal)."""

    op: str
    rid: str
    nonce: str
    ts_ms: int
    body: bytes
    signed: bool = True


class BadSignature(ValueError):
    """Not a message signed with this key. ``header`` is the message's header when it had
    a well-formed one (its ``body`` then unverified): enough to answer it."""

    def __init__(self, message: str, header: Sealed | None = None) -> None:
        super().__init__(message)
        self.header = header


def new_nonce() -> str:
    return secrets.token_hex(16)


def _mac(key: bytes, kind: Kind, op: str, rid: str, nonce: str, ts_ms: int,
         body: bytes) -> str:
    signed = f"{kind.value} {op} {rid} {nonce} {ts_ms}\n".encode() + body
    return hmac.new(key, signed, hashlib.sha256).hexdigest()


def seal(key: bytes | None, kind: Kind, op: str, rid: str, nonce: str, body: str,
         ts_ms: int | None = None) -> str:
    """The wire text of a message; ``key`` ``None``: an unsigned one (a refusal only)."""
    ts_ms = time.time_ns() // 1_000_000 if ts_ms is None else ts_ms
    mac = UNSIGNED if key is None else _mac(key, kind, op, rid, nonce, ts_ms, body.encode())
    return f"{MAGIC} {mac} {op} {rid} {nonce} {ts_ms}\n{body}"


def unseal(key: bytes, kind: Kind, raw: bytes | str,
           max_bytes: int = MAX_MESSAGE_BYTES) -> Sealed:
    """The message in ``raw`` when its MAC verifies with ``key``; raises BadSignature otherwise, or
    when it is over ``max_bytes``, the body unread."""
    data = raw.encode(errors="surrogateescape") if isinstance(raw, str) else bytes(raw)
    if len(data) > max_bytes:
        raise BadSignature(f"larger than {max_bytes} bytes")
    found = _HEADER.match(data)
    if found is None:
        raise BadSignature("not a signed message")
    mac, op, rid, nonce, ts = (part.decode() for part in found.groups())
    header = Sealed(op, rid, nonce, int(ts), data[found.end():], signed=False)
    if mac == UNSIGNED:
        raise BadSignature("unsigned", header)
    if not hmac.compare_digest(mac, _mac(key, kind, op, rid, nonce, int(ts), header.body)):
        raise BadSignature("its signature does not verify (another job token)", header)
    return Sealed(op, rid, nonce, int(ts), header.body)


class ReplayGuard:
    """Accepts each signed request once, and only within :data:`REPLAY_WINDOW` of its stamp.

    It sees only verified requests, so its memory is bounded by the job's traffic, not a stranger's.
    """

    def __init__(self, window: float = REPLAY_WINDOW) -> None:
        self._window_ms = int(window * 1000)
        self._seen: set[str] = set()
        self._expiries: list[tuple[int, str]] = []
        """A heap of (the time a nonce's request becomes stale, the nonce)."""

    def check(self, sealed: Sealed, now_ms: int | None = None) -> str | None:
        """Why ``sealed`` must be refused (``stale``, ``replayed``), or ``None`` to accept it."""
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        while self._expiries and self._expiries[0][0] < now_ms:
            self._seen.discard(heapq.heappop(self._expiries)[1])
        if abs(now_ms - sealed.ts_ms) > self._window_ms:
            return "stale"
        if sealed.nonce in self._seen:
            return "replayed"
        self._seen.add(sealed.nonce)
        heapq.heappush(self._expiries, (sealed.ts_ms + self._window_ms, sealed.nonce))
        return None

    @property
    def window(self) -> float:
        return self._window_ms / 1000

    def __len__(self) -> int:
        return len(self._seen)


class MissingToken(ValueError):
    """A process of a job without a token, and without the user's opt-in to run so."""


def checked_token(token: str, insecure_no_token: bool) -> str:
    """``token``, unless it is empty and the user did not opt in to run without one.

    With an empty key, anyone who reaches the scheduler's port can forge messages (docs/security.md).
    """
    if not token and not insecure_no_token:
        raise MissingToken(f"no job token: set {names.TFT_JOB_TOKEN} to a secret shared by the "
                           f"job's processes (templates/run.sh makes one), or "
                           f"{names.TFT_INSECURE_NO_TOKEN}=1 to run without authentication")
    return token


MIN_TOKEN_BITS = 128
"""A user-set token must be random text of at least this much: 32 hex digits or 22 base64url characters,
unless TFT_INSECURE_WEAK_TOKEN=1. The MACs on the wire let whoever sees them test guesses offline, and a
rule on the token's form refuses a password that a length rule would pass."""
_HEX_TOKEN = re.compile(r"[0-9a-fA-F]+")
_BASE64_TOKEN = re.compile(r"[A-Za-z0-9_+/-]+={0,2}")


class WeakToken(ValueError):
    """A user-set job token too short to resist an offline guess."""


def _strong_token(token: str) -> bool:
    """Whether ``token`` is hex of :data:`MIN_TOKEN_BITS` or base64(url) of as much; a
    token of hex digits only is counted as hex."""
    if _HEX_TOKEN.fullmatch(token):
        return len(token) * 4 >= MIN_TOKEN_BITS
    if _BASE64_TOKEN.fullmatch(token):
        return len(token.rstrip("=")) * 6 >= MIN_TOKEN_BITS
    return False


def checked_strength(token: str, allow_weak: bool) -> str:
    """``token``, unless it is non-empty, not :func:`_strong_token` and the user did not
    opt in (an empty token is :func:`checked_token`'s business)."""
    if token and not allow_weak and not _strong_token(token):
        raise WeakToken(f"{names.TFT_JOB_TOKEN} is not a random 128-bit secret: give 32 or more "
                        f"hex digits or 22 or more base64url characters (e.g. python3 -c 'import "
                        f"secrets; print(secrets.token_hex(16))'); {names.TFT_INSECURE_WEAK_TOKEN}=1 "
                        f"accepts it")
    return token


def job_key(token: str, run_id: str, epoch: str) -> bytes:
    """The one key that signs everything of one launch of job ``run_id``: HMAC-SHA256 keyed with the
    token over the run id and the launch's random ``epoch``, so two jobs sharing a token, or two
    launches of one job, never accept each other's messages."""
    return hmac.new(token.encode(), f"tft job key {run_id}\n{epoch}".encode(),
                    hashlib.sha256).digest()


def _value_mac(key: bytes, name: str, value: str) -> str:
    return hmac.new(key, f"value {name}\n{value}".encode(), hashlib.sha256).hexdigest()


def sign_value(key: bytes, name: str, value: str) -> str:
    """What to store under ``name``: ``<mac> <value>``, the MAC keyed with ``key`` over the name and the
    value, so a value signed for one key never passes for another's."""
    return f"{_value_mac(key, name, value)} {value}"


def open_value(key: bytes, name: str, stored: bytes | str) -> str:
    """The value :func:`sign_value` stored under ``name``; raises BadSignature for anything else
    (unsigned, signed for another key or job, not text)."""
    try:
        text = stored.decode() if isinstance(stored, bytes) else stored
    except UnicodeDecodeError:
        raise BadSignature("not text") from None
    mac, _, value = text.partition(" ")
    if not hmac.compare_digest(mac.encode(), _value_mac(key, name, value).encode()):
        raise BadSignature(f"the value of {name} does not verify")
    return value


def keyed_name(key: bytes, what: str) -> str:
    """A store prefix for ``what`` (e.g. ``generation 3``) that only the job's processes
    can compute: 32 hex digits of a MAC keyed with the job key. Nobody without it can
    plant keys under it ahead of the job."""
    return hmac.new(key, f"name {what}".encode(), hashlib.sha256).hexdigest()[:32]
