"""What the nodes of one job share through the scheduler's store on node 0.

Nodes share no file system, only the network. Everything one node's tftrun must learn
from another goes through these keys of the cluster store (the scheduler's, on node 0):

* ``tft/job``: the job's identity (run id, lineage, worker count, node count, and the
  epoch this launch drew), set by the scheduler when it starts. A node other than node 0
  waits for it before it starts anything: it is also the sign that node 0's scheduler is
  up. Its value carries a MAC keyed with the job token over the whole identity: the
  proof that node 0 holds the token, without the token. A node given another token
  cannot verify it and stops. As the token alone signs it, a value recorded from another
  job or an earlier launch verifies too: the joining node then asks node 0's scheduler
  which job it serves now (recovery/control/job_proof.py) and takes that answer.
* ``tft/rendezvous/<n>``: ``host:port`` of the fresh ``env://`` store of group restart
  ``n``, hosted by node 0's supervisor (launcher/nodes/rendezvous.py). Every node's workers of
  restart ``n`` meet there.
* ``tft/restart_all``: the highest group restart any node has started. A node that
  restarts its workers raises it; the others see it and restart theirs.
* ``tft/end``: why the job ended, set by the node that ended it for a reason that ends
  every node (a failure no restart fixes, a node that did not come back).
* ``tft/over``: node 0's job ended, with its exit status and why (JSON ``{"status",
  "reason"}``), set by node 0 before it stops its scheduler; ``tft/node/<K>/left``: node
  ``K`` ends (it saw ``tft/over``, or ended for a reason of its own). Node 0 keeps its
  store up until every live node left, or a bounded wait passed
  (launcher/nodes/job_end.py).
* ``tft/node/<K>/beat``: a count node ``K``'s tftrun raises every half second (and the
  group restart it waits to join, if any): node 0 tells a live node from a lost one by it,
  whether or not its workers use ``recovery``; only a rise is life
  (launcher/nodes/presence.py).
* ``tft/round/<n>/join/<K>``: node ``K`` joined group restart ``n`` of an elastic job
  (``--nnodes=MIN:MAX``); ``tft/round/<n>``: the nodes node 0 closed that round with,
  e.g. ``0,2`` (recovery/control/node_range.py).

The store has no authentication (docs/security.md): whoever reaches the port can read and
write these keys. So none of them holds a secret, and every value is signed
(:func:`recovery.control.signing.sign_value`): ``tft/job`` with the token, the others with
the key of the job's launch (:func:`recovery.control.signing.job_key`: token, run id and
epoch), each MAC over the key's name and its value; the names they are kept under are
keyed with it too (:func:`stored_at`), so an earlier launch's are other names. A value
that does not verify, is longer than :data:`MAX_VALUE_BYTES` or does not parse is read
as unset, and reported: a stranger can hide a key, never steer a node.
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
    """The store key under which the value of ``name`` signed with ``key`` is kept:
    ``<name>/<a MAC of the name>``, which only the job's processes can compute. A stranger
    who overwrites the plain names hides nothing from them; one who lists the store's keys
    and overwrites these too can deny service, never steer (docs/security.md)."""
    return f"{name}/{keyed_name(key, name)}"


def read_signed(client: TCPStoreClient, key: bytes, name: str) -> str | None:
    """The value signed with ``key`` under ``name``, or ``None`` when unset (no waiting).

    Raises:
        BadValue: it is set to anything else (the client's connection is then left as
            it was, or dropped when the value was too long to read).
    """
    where = stored_at(key, name)
    if not client.check([where]):
        return None
    stored = bytes(client.get(where, MAX_VALUE_BYTES))
    try:
        return open_value(key, name, stored)
    except BadSignature as err:
        raise BadValue(str(err)) from None


def raise_counter(client: TCPStoreClient, key: bytes, name: str, value: int) -> int:
    """Raise the signed integer under ``name`` to at least ``value``, atomically; the result.

    Several nodes may raise it at once (each restarting after the same failure): the
    store's compare-and-set makes them agree, and a value is never lowered. A value that
    is not the job's (a stranger's) counts as unset, and is replaced.
    """
    where = stored_at(key, name)
    while True:
        current = bytes(client.get(where, MAX_VALUE_BYTES)) if client.check([where]) else b""
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
