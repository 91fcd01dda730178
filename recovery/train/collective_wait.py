"""Waiting for a collective of the current generation so that a newer generation, or a
stop, interrupts it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from recovery.runtime.abort import Aborted, ShouldAbort, never
from recovery.runtime.cluster import ClusterContext

__all__ = ["POLL", "PeerFailure", "wait_collective"]

POLL = timedelta(milliseconds=50)
"""How long one wait on a collective lasts before the generation is checked again and news asked
for: a survivor blocked on a dead rank it is no neighbour of learns of it only from the scheduler."""


class PeerFailure(RuntimeError):
    """A collective of the current generation cannot complete: a member is gone."""


def wait_collective(work: Any, ctx: ClusterContext, should_abort: ShouldAbort = never,
                    held: Callable[[], bool] = never) -> None:
    """Wait for an async collective, polling, so that a new generation interrupts it (unless ``held()``: a
    replay admits its ranks at a later step). Raises PeerFailure for a lost peer or a newer generation,
    and Aborted when ``should_abort()`` says so, the collective still in flight: the caller must leave
    the group."""
    while True:
        try:
            work.wait(timeout=POLL)
            return
        except RuntimeError as err:
            timed_out = "timed out" in str(err).lower()
            cause = "a newer generation was formed" if timed_out else str(err).splitlines()[0]
        # Outside the except block: the exception and its traceback (which hold the
        # broken group's buffers) are released before anyone re-forms.
        if timed_out and should_abort():
            raise Aborted("gave up waiting for the collective")
        if timed_out and (ctx.latest_generation == ctx.generation or held()):
            ctx.look_for_news()
            continue
        raise PeerFailure(cause if timed_out else ctx.peer_failed(cause))
