"""How node 0's scheduler shows the other nodes which job, and which launch of it, it serves.

``tft/job`` is signed with the token alone, so another job sharing the token, or an earlier launch,
verifies as well. A joining node therefore asks with a fresh nonce (:func:`ask_key`); the reply answers
that nonce only and names the scheduler's address, which must be the one asked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any

from recovery.control.nodes import MAX_VALUE_BYTES, BadValue, JobIdentity, job_names, job_value
from recovery.control.rpc import Op, SchedulerLink
from recovery.control.signing import BadSignature, Kind, ReplayGuard, Sealed, seal, unseal
from recovery.control.tcpstore_client import TCPStoreClient
from recovery.control.throttle import Throttle

__all__ = ["ask_key", "JobNotice", "JobProof", "ask_job", "parse_proof"]

logger = logging.getLogger(__name__)


def ask_key(token: str) -> bytes:
    """The key of a joining node's question and of its answer: the token's, under a name
    of its own (no other message is signed with it)."""
    return hmac.new(token.encode(), b"tft job question", hashlib.sha256).digest()


@dataclass(frozen=True)
class JobProof:
    """The scheduler's answer: the job it serves, and where it serves it (``host:port``)."""

    job: JobIdentity
    address: str


class JobNotice:
    """The scheduler's side: :data:`~recovery.control.nodes.JOB_KEY` under its names, put back when
    overwritten, and the answers to the joining nodes' questions, each once (``replays``)."""

    def __init__(self, token: str, job: JobIdentity, replays: ReplayGuard) -> None:
        self._names = job_names(token)
        self._value = job_value(token, job).encode()
        self._job = job
        self._key = ask_key(token)
        self._replays = replays
        self._address = ""
        self._overwritten = Throttle()

    def publish(self, client: Any, host: str, port: int) -> None:
        """Set the job's identity, served at ``host:port``, under its names."""
        self._address = f"{host}:{port}"
        for name in self._names:
            client.set(name, self._value)

    def guard(self, client: TCPStoreClient) -> None:
        """Set the identity again under each name that holds anything else. Raises StoreError (a value
        too long drops the connection)."""
        for name in self._names:
            if client.peek(name, MAX_VALUE_BYTES) != self._value:
                client.set(name, self._value)
                if (count := self._overwritten.note()) is not None:
                    logger.warning("%s was overwritten %d time(s) by someone else; put back",
                                   name, count)

    def proof(self) -> dict[str, Any]:
        """What a question is answered (a reply's body)."""
        return {"ok": True, "job": json.loads(self._job.to_json()), "address": self._address}

    def answer(self, raw: bytes, header: Sealed | None) -> tuple[str | None, str | None] | None:
        """The reply to ``raw`` if it is a joining node's question signed with the token: the request
        id to reply under and the reply (both ``None``: asked already); else ``None``, handled as
        usual. ``header``, from the failed check with the job's key, says by its op whether ``raw`` may
        be a question."""
        if header is None or header.op != Op.JOB.value:
            return None
        try:
            asked = unseal(self._key, Kind.REQUEST, raw)
        except BadSignature:
            return None
        if self._replays.check(asked) is not None:
            return None, None
        return asked.rid, seal(self._key, Kind.REPLY, asked.op, asked.rid, asked.nonce,
                               json.dumps(self.proof()))


def ask_job(host: str, port: int, token: str, reply_timeout: float, deadline: float) -> JobProof:
    """Ask the scheduler at ``host:port`` which job it serves, until ``deadline`` (monotonic). Raises
    SchedulerUnavailable when no answer verifies by then, BadValue for an answer signed with the token
    that is not a proof."""
    link = SchedulerLink(host, port, token, reply_timeout, key=ask_key(token))
    try:
        return parse_proof(link.call_until(Op.JOB, deadline))
    finally:
        link.close()


def parse_proof(reply: dict[str, Any]) -> JobProof:
    """The proof in a verified reply to a question. Raises BadValue."""
    try:
        return JobProof(JobIdentity.from_json(json.dumps(reply["job"])), str(reply["address"]))
    except (KeyError, TypeError, ValueError) as err:
        raise BadValue(f"not an answer to which job: {str(reply)[:80]!r} ({err})") from None
