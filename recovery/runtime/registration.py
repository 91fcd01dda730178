"""Registering a worker with the scheduler, retrying while it is unreachable or refuses
for a while."""

from __future__ import annotations

import logging
import time
from typing import Any

from recovery.control.beat_channel import LocalLink
from recovery.control.members import Identity
from recovery.control.rpc import Op, SchedulerLink, SchedulerUnavailable, UnverifiedReply
from recovery.exit_codes import REGISTRATION_REFUSED
from recovery.runtime.generation_wait import ClusterError

__all__ = ["RegistrationRefused", "register"]

logger = logging.getLogger(__name__)

_TOKEN_REFUSALS = 3
"""Registration attempts in a row answered only by an unsigned ``token`` refusal before a
worker takes its token for wrong."""


class RegistrationRefused(ClusterError, SystemExit):
    """The scheduler refused this worker for good. Uncaught, it ends the process with
    :data:`recovery.exit_codes.REGISTRATION_REFUSED`, which tells tftrun no restart helps."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = REGISTRATION_REFUSED


def register(link: SchedulerLink | LocalLink, identity: Identity, deadline: float,
             ready: bool = True, whole: bool = False) -> dict[str, Any]:
    """Register, retrying while the scheduler is unreachable or refuses for a while. A refusal
    for a wrong token cannot be signed, so it is believed only after :data:`_TOKEN_REFUSALS`
    attempts in a row got it."""
    said = ""
    token_refusals = 0
    while (left := deadline - time.monotonic()) > 0:
        if not link.wait_connected(min(left, 1.0)):
            said = _say_once(said, f"waiting for the scheduler at {link.where}")
            continue
        try:
            reply = link.call(Op.REGISTER, node_id=identity.node_id, pid=identity.pid,
                              incarnation=identity.incarnation, host=identity.host,
                              rank=identity.rank, ready=ready, **({"whole": True} if whole else {}))
        except UnverifiedReply as err:
            token_refusals = token_refusals + 1 if err.claimed == "token" else 0
            if token_refusals >= _TOKEN_REFUSALS:
                message = ("registration refused (token): wrong job token: the scheduler "
                           "cannot verify this process's signature")
                logger.error("%s", message)
                raise RegistrationRefused(message) from None
            continue
        except SchedulerUnavailable:
            continue
        token_refusals = 0
        if reply.get("ok"):
            return reply
        message = f"registration refused ({reply.get('reason')}): {reply.get('message')}"
        if reply.get("retry_after") is None:
            logger.error("%s", message)
            raise RegistrationRefused(message)
        said = _say_once(said, message + "; retrying")
        time.sleep(min(float(reply["retry_after"]), max(deadline - time.monotonic(), 0.0)))
    message = f"not admitted within cluster_time_out: {said or 'no answer'}"
    logger.error("%s", message)
    raise ClusterError(message)


def _say_once(said: str, message: str) -> str:
    """Log a waiting message when it changes; return it."""
    if message != said:
        logger.warning("%s", message)
    return message
