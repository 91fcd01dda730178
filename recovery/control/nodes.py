"""What the nodes of one job share through the scheduler's store on node 0.

Nodes share no file system, only the network. Everything one node's tftrun must learn
from another goes through these keys of the cluster store (the scheduler's, on node 0):

* ``tft/job``: the job's identity (run id, lineage, worker count), set by the
  scheduler when it starts. A node other than node 0 waits for it before it starts
  anything: it is also the sign that node 0's scheduler is up.
* ``tft/job_token_proof``: that node 0 holds the job token, without the token
  (:func:`recovery.control.signing.token_proof` of the run id), set just before
  ``tft/job``. A node given another token sees the difference and stops before it starts
  anything.
* ``tft/rendezvous/<n>``: ``host:port`` of the fresh ``env://`` store of group restart
  ``n``, hosted by node 0's supervisor (launcher/nodes/rendezvous.py). Every node's workers of
  restart ``n`` meet there.
* ``tft/restart_all``: the highest group restart any node has started. A node that
  restarts its workers raises it; the others see it and restart theirs.
* ``tft/end``: why the job ended, set by the node that ended it for a reason that ends
  every node (a failure no restart fixes, a node that did not come back).

The store has no authentication (docs/security.md): whoever reaches the port can read and
write these keys. So none of them holds a secret: the job token is never here. Every node
is given the same token (``TFT_JOB_TOKEN``) by whoever starts it, and a node misled by a
forged key gets no further than the scheduler, which refuses its workers' unsigned or
wrongly signed requests.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["JOB_KEY", "TOKEN_PROOF_KEY", "RESTART_KEY", "END_KEY", "JobIdentity", "rendezvous_key",
           "raise_counter", "read_text"]

JOB_KEY = "tft/job"
TOKEN_PROOF_KEY = "tft/job_token_proof"
RESTART_KEY = "tft/restart_all"
END_KEY = "tft/end"


def rendezvous_key(restart_count: int) -> str:
    return f"tft/rendezvous/{restart_count}"


@dataclass(frozen=True)
class JobIdentity:
    """What makes the processes of every node one job."""

    run_id: str
    lineage: str
    worker_num: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> JobIdentity:
        """Raises ValueError when ``text`` is not a job identity."""
        try:
            data = json.loads(text)
            return cls(str(data["run_id"]), str(data["lineage"]), int(data["worker_num"]))
        except (KeyError, TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"not a job identity: {text!r:.80}") from err


def read_text(client: Any, key: str) -> str | None:
    """The value of ``key`` in the store, or ``None`` when it is not set (no waiting)."""
    if not client.check([key]):
        return None
    return bytes(client.get(key)).decode()


def raise_counter(client: Any, key: str, value: int) -> int:
    """Raise the integer under ``key`` to at least ``value``, atomically; the result.

    Several nodes may raise it at once (each restarting after the same failure): the
    store's compare-and-set makes them agree, and a value is never lowered.
    """
    while True:
        current = read_text(client, key)
        have = int(current) if current is not None else -1
        if have >= value:
            return have
        expected = current if current is not None else ""
        got = bytes(client.compare_set(key, expected, str(value))).decode()
        if got == str(value):
            return value
        time.sleep(0.01)  # another node raised it in between: read again
