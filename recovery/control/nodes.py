"""What the nodes of one job share through the scheduler's store on node 0.

Nodes share no file system, so everything one node's tftrun must learn from another goes through these
keys (the table: docs/security.md). The store has no authentication, so every value is signed under a
name only the job can compute (:func:`stored_at`), and one that does not verify, is too long or does
not parse reads as unset: a stranger can hide a key, never steer a node.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from recovery.control.signing import BadSignature, keyed_name, open_value, sign_value
from recovery.control.tcpstore_client import TCPStoreClient

__all__ = ["JOB_KEY", "RESTART_KEY", "END_KEY", "OVER_KEY", "left_key", "MAX_VALUE_BYTES", "JobIdentity",
           "BadValue", "rendezvous_key", "raise_counter", "read_signed", "job_value",
           "parse_job", "parse_address", "stored_at", "job_names", "beat_key", "round_key",
           "join_key", "parse_nodes"]

JOB_KEY = "tft/job"
RESTART_KEY = "tft/restart_all"
END_KEY = "tft/end"
OVER_KEY = "tft/over"
MAX_VALUE_BYTES = 65_536
"""The most a node reads of a control key: a longer value is nobody's."""


def rendezvous_key(restart_count: int) -> str:
    return f"tft/rendezvous/{restart_count}"


def beat_key(node_rank: int) -> str:
    return f"tft/node/{node_rank}/beat"


def left_key(node_rank: int) -> str:
    return f"tft/node/{node_rank}/left"


def round_key(restart_count: int) -> str:
    return f"tft/round/{restart_count}"


def join_key(restart_count: int, node_rank: int) -> str:
    return f"{round_key(restart_count)}/join/{node_rank}"


def parse_nodes(text: str) -> tuple[int, ...]:
    """A round's nodes, ``0,2``, as node ranks (empty: the job ended). Raises BadValue."""
    if not text:
        return ()
    parts = text.split(",")
    if not all(part.isdigit() for part in parts):
        raise BadValue(f"not node ranks: {text[:80]!r}")
    return tuple(int(part) for part in parts)


@dataclass(frozen=True)
class JobIdentity:
    """What makes the processes of every node one job."""

    run_id: str
    lineage: str
    worker_num: int
    node_num: int = 1
    epoch: str = ""
    """The launch's epoch (``TFT_JOB_EPOCH``)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> JobIdentity:
        """Raises ValueError when ``text`` is not a job identity."""
        try:
            data = json.loads(text)
            return cls(str(data["run_id"]), str(data["lineage"]), int(data["worker_num"]),
                       int(data.get("node_num", 1)), str(data.get("epoch", "")))
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError,
                RecursionError) as err:
            raise ValueError(f"not a job identity: {str(text)[:80]!r}") from err


class BadValue(ValueError):
    """A control key holds what none of the job's processes wrote."""


def job_value(token: str, job: JobIdentity) -> str:
    """What the scheduler stores under :data:`JOB_KEY`: the identity, signed with the token."""
    return sign_value(token.encode(), JOB_KEY, job.to_json())


def job_names(token: str) -> tuple[str, str]:
    """Where the scheduler keeps the job's identity: :data:`JOB_KEY`, and the name only
    holders of the token can compute (:func:`stored_at`), which the other nodes read."""
    return JOB_KEY, stored_at(token.encode(), JOB_KEY)


def parse_job(token: str, stored: bytes) -> JobIdentity:
    """The identity in :data:`JOB_KEY`'s value. Raises BadValue."""
    try:
        return JobIdentity.from_json(open_value(token.encode(), JOB_KEY, stored))
    except (BadSignature, ValueError) as err:
        raise BadValue(str(err)) from None


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` as a pair. Raises BadValue."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadValue(f"not host:port: {text[:80]!r}")
    return host, int(port)


def stored_at(key: bytes, name: str) -> str:
    """The store key under which ``name`` signed with ``key`` is kept: ``<name>/<a MAC of the name>``,
    which only the job's processes can compute, so a stranger who overwrites the plain names hides
    nothing (docs/security.md)."""
    return f"{name}/{keyed_name(key, name)}"


def read_signed(client: TCPStoreClient, key: bytes, name: str) -> str | None:
    """The value signed with ``key`` under ``name``, or ``None`` when unset (no waiting).

    Raises BadValue when set to anything else (the connection is dropped if it was too long to read).
    """
    stored = client.peek(stored_at(key, name), MAX_VALUE_BYTES)
    if stored is None:
        return None
    try:
        return open_value(key, name, stored)
    except BadSignature as err:
        raise BadValue(str(err)) from None


def raise_counter(client: TCPStoreClient, key: bytes, name: str, value: int) -> int:
    """Raise the signed integer under ``name`` to at least ``value``, atomically; the result.

    Nodes raising it at once agree by compare-and-set; a stranger's value is unset and replaced.
    """
    where = stored_at(key, name)
    while True:
        current = client.peek(where, MAX_VALUE_BYTES) or b""
        try:
            have = int(open_value(key, name, current)) if current else -1
        except (BadSignature, ValueError):
            have = -1
        if have >= value:
            return have
        desired = sign_value(key, name, str(value))
        got = bytes(client.compare_set(where, current, desired, MAX_VALUE_BYTES))
        if got == desired.encode():
            return value
        time.sleep(0.01)  # another node raised it in between: read again
