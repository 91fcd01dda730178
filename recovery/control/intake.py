"""The scheduler's intake of one request: its signature checked first, a replay or a stale
stamp refused, its body parsed, a retry answered as the first attempt was, then its op's
handler; refusals are reported at most every few seconds."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from recovery.control.job_proof import JobNotice
from recovery.control.replies import KeptReplies, SentReplies
from recovery.control.requests import BadRequest, Request, parse_request
from recovery.control.rpc import Op
from recovery.control.signing import WRONG_TOKEN, BadSignature, Kind, ReplayGuard, Sealed, seal, unseal
from recovery.control.throttle import Throttle
from recovery.events import EventLog

__all__ = ["TICK", "RequestIntake"]

logger = logging.getLogger(__name__)

TICK = json.dumps({"op": Op.TICK.value}).encode()
"""What the ticker pushes: the one message that is not signed (it only wakes the loop)."""
_KEPT = frozenset({Op.EXIT, Op.LEAVE, Op.INJECT, Op.LAST_WORDS})
"""The ops whose replies are kept for a retry: carried out twice, they would not do the
same (a second cooldown, a second injection, a claim granted but never learned)."""


class RequestIntake:
    """The part of :class:`recovery.control.scheduler.Scheduler` that takes a request in
    and seals its reply; the attributes are the scheduler's, set in its ``__init__``."""

    events: EventLog
    replies: KeptReplies
    ticks: int
    _key: bytes
    _notice: JobNotice
    _replays: ReplayGuard
    _sent: SentReplies
    _refusals: dict[str, Throttle]
    _behind: Throttle | None
    _stamp: float | None
    _check_pending: bool
    _changed: bool
    _handlers: dict[Op, Callable[[Request], dict[str, Any] | None]]

    def _handle(self, raw: bytes) -> tuple[str | None, str | None]:
        """Decide on one request: the id to reply under (``None``: no reply) and the reply's wire text.
        One that does not verify is answered ``token``, unsigned (all a process with another job's
        token can read); a replay gets no answer, a retry the first one's (nothing is done again)."""
        self._report_refusals()
        if raw == TICK:
            self.ticks += 1
            return None, None
        try:
            sealed = unseal(self._key, Kind.REQUEST, raw)
        except BadSignature as err:
            header = err.header
            if (answer := self._notice.answer(raw, header)) is not None:  # a joining node's question
                return answer
            self._refused("signature", None if header is None else header.op, str(err))
            if header is None or self._behind is not None:  # a flood is not answered
                return None, None
            self._sent.sent(header.rid)
            return header.rid, seal(None, Kind.REPLY, header.op, header.rid, header.nonce,
                                    json.dumps(WRONG_TOKEN))
        problem = self._replays.check(sealed)
        if problem == "replayed":
            self._refused(problem, sealed.op, "a request already accepted, sent again")
            return None, None
        if problem == "stale":
            message = (f"its time stamp is more than {self._replays.window:g}s from the "
                       f"scheduler's clock: old, or the clocks of the hosts differ")
            self._refused(problem, sealed.op, message)
            self._sent.sent(sealed.rid)
            return sealed.rid, self._sealed(sealed, {"ok": False, "reason": "clock",
                                                     "message": message, "retry_after": None})
        self._stamp = sealed.ts_ms / 1000
        try:
            request = parse_request(sealed)
            self._check_pending = True
        except BadRequest as err:
            self._refused("bad_request", sealed.op, str(err))
            return sealed.rid, self._sealed(sealed, {"ok": False, "reason": "bad_request",
                                                     "message": str(err)})
        rid = request.rid
        kept = self.replies.get(rid)
        if kept is not None:
            return rid, self._sealed(sealed, kept)
        reply = self._handlers[request.op](request)
        if reply is None:
            return None, None
        if reply["ok"] and request.op in _KEPT:
            self.replies.keep(rid, reply)
            self._changed = True  # persisted before the reply, as what it answers
        return rid, self._sealed(sealed, reply)

    def _sealed(self, request: Sealed, reply: dict[str, Any]) -> str:
        """``reply`` signed, answering the attempt ``request`` (its op, id and nonce)."""
        return seal(self._key, Kind.REPLY, request.op, request.rid, request.nonce,
                    json.dumps(reply))

    def _refused(self, reason: str, op: str | None, message: str) -> None:
        """Count a refused request; report at most one per reason every few seconds."""
        throttle = self._refusals.setdefault(reason, Throttle())
        if (count := throttle.note()) is not None:
            self._report_refused(reason, count, op, message)

    def _report_refusals(self) -> None:
        """Report the refusals held back whose report is due (the ticks bring us here)."""
        for reason, throttle in self._refusals.items():
            if (count := throttle.due()) is not None:
                self._report_refused(reason, count, None, "")

    def _report_refused(self, reason: str, count: int, op: str | None, message: str) -> None:
        logger.warning("refused %d request(s) (%s)%s%s", count, reason,
                       "" if op is None else f", latest {op}", message and f": {message}")
        self.events.emit("request_refused", reason=reason, count=count, op=op,
                         message=message)
