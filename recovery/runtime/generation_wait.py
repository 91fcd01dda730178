"""Waiting for the scheduler to form a generation: its store client and its members' ranks."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from recovery.control.membership import describe_incomplete
from recovery.control.rpc import Op, SchedulerLink, SchedulerUnavailable, open_client, port_open, ready_at, ready_ranks
from recovery.runtime.abort import Aborted, ShouldAbort, never
from recovery.timeouts import Timeouts

__all__ = ["wait_for_generation", "missing_ranks", "ClusterError", "REPLY_TIMEOUT"]

logger = logging.getLogger(__name__)

REPLY_TIMEOUT = 5.0
_RETRY_PAUSE = 0.1
_GENERATION_POLL = 0.05
"""Seconds between two looks at whether the generation a worker waits for is formed."""


class ClusterError(RuntimeError):
    """This worker could not join the cluster (refused, or the cluster never completed)."""


def wait_for_generation(link: SchedulerLink, generation: int, deadline: float,
                        timeouts: Timeouts, world_size: int, rank: int,
                        superseded: Callable[[], bool],
                        should_abort: ShouldAbort = never) -> tuple[Any, list[int]] | None:
    """A store client and the members' ranks, once the scheduler says ``generation`` is
    formed; ``None`` once ``superseded()`` says a newer generation has this worker in it;
    :class:`Aborted` when ``should_abort()`` says so. The ready key is polled with ``check``,
    since a blocking ``wait``'s timeout logs a C++ warning."""
    from torch.distributed import DistNetworkError

    store = None
    while (left := deadline - time.monotonic()) > 0:
        if should_abort():
            raise Aborted(f"stopped waiting for generation {generation} to form")
        if superseded():
            return None
        if store is None and not port_open(link.host, link.port):
            time.sleep(_RETRY_PAUSE)
            continue
        try:
            # The rendezvous of the group waits on this client too: as long as we may.
            store = store or open_client(link.host, link.port, max(left, REPLY_TIMEOUT))
            ready = ready_at(link.key, generation)
            if store.check([ready]) and (
                    active := ready_ranks(link.key, generation, store.get(ready))) is not None:
                return store, active
        except DistNetworkError:
            store = None  # the scheduler died: wait for its relaunch
        time.sleep(_GENERATION_POLL)
    missing = missing_ranks(link, world_size, rank)
    message = describe_incomplete(timeouts.cluster_time_out, world_size, missing)
    logger.error("%s", message)
    raise ClusterError(message)


def missing_ranks(link: SchedulerLink, world_size: int, rank: int) -> list[int]:
    """The ranks the scheduler misses; when it is gone, every rank but this one."""
    try:
        # A rank's scope: the whole table is O(ranks), and every rank may ask at once.
        return list(link.call(Op.STATUS, first_rank=rank, nproc=1, missing=True)["missing"])
    except (SchedulerUnavailable, KeyError):
        return [r for r in range(world_size) if r != rank]
