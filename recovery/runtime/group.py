"""Forming and retiring one generation's default process group, without ever hanging.

Two traps of torch 2.13's gloo (docs/architecture.md) shape it:

* **A member that dies during the rendezvous.** ``init_process_group`` waits for every
  member's address in the store for the whole group timeout (minutes): if a member of
  the generation dies before it has published it, the others are stuck there while the
  scheduler already forms the next generation. So the members first *meet* — each sets
  its arrival key under the generation's prefix and polls until all are there, giving
  up as soon as the scheduler has formed a newer generation — and only then connect,
  with the rendezvous bounded by the heartbeat timeout (the time within which a dead or
  frozen member is declared so); the group's own timeout is set once it is formed.
* **A collective still in flight when the group is left.** Destroying a gloo group joins
  its worker threads, so a survivor whose all-reduce is blocked on a peer waits until
  every peer has freed its own old group, or for the group timeout. Survivors therefore
  *retire* the old group: it is unregistered at once, and its last reference is dropped
  by a background thread, where the blocking join does no harm. The process must not
  exit while such a join is still blocked (the C++ runtime aborts it), so
  :func:`exit_blocked` tells the exit path to leave without waiting.

An NCCL group is left as torch documents it instead: aborted (``ncclCommAbort`` frees a
collective blocked on a dead peer at once), with ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` set
to :data:`NCCL_ERROR_HANDLING` before it forms, so that torch's watchdog leaves the
errors to this module rather than ending the process (``1``, torchrun's value, tears it
down, and so does ``3``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from recovery.env import TORCH_NCCL_ASYNC_ERROR_HANDLING
from recovery.runtime.abort import Aborted, ShouldAbort, never

__all__ = ["meet", "connect", "retire", "release", "exit_blocked", "NCCL_ERROR_HANDLING"]

logger = logging.getLogger(__name__)

NCCL_ERROR_HANDLING = "0"
"""``TORCH_NCCL_ASYNC_ERROR_HANDLING`` for an NCCL group: no handling by torch's watchdog,
as torch asks of a process that aborts its groups itself (``_abort_process_group``)."""
_MEET_POLL = 0.05
_retiring: list[threading.Thread] = []


def _arrival_key(rank: int) -> str:
    return f"tft/arrived/{rank}"


def meet(store: Any, rank: int, world_size: int, newer: Callable[[], bool],
         deadline: float, should_abort: ShouldAbort = never) -> bool:
    """Announce this rank in the generation's ``store`` and wait for all ``world_size``.

    Returns:
        True once every member has arrived; False as soon as ``newer()`` says a newer
        generation exists (this one will never complete), or at ``deadline``.

    Raises:
        DistNetworkError: the store's server (the scheduler) went away.
        Aborted: ``should_abort()`` said so.
    """
    store.set(_arrival_key(rank), "1")
    keys = [_arrival_key(r) for r in range(world_size)]
    while not store.check(keys):
        if should_abort():
            raise Aborted(f"rank {rank} stopped waiting for the members of its generation")
        if newer() or time.monotonic() > deadline:
            return False
        time.sleep(_MEET_POLL)
    return True


def connect(backend: str, store: Any, rank: int, world_size: int,
            rendezvous_timeout: float, group_timeout: timedelta | None) -> bool:
    """Initialise the default process group once every member has met.

    Returns:
        False when the rendezvous failed within ``rendezvous_timeout`` seconds (a member
        died between meeting and connecting); the caller moves to a newer generation.

    Raises:
        DistNetworkError: the store's server (the scheduler) went away; the caller
            meets again in the same generation once it is back.
    """
    import torch.distributed as dist
    from torch.distributed import DistNetworkError
    from torch.distributed.constants import default_pg_timeout

    from recovery.runtime import torch_compat

    if backend == "nccl":
        _leave_nccl_errors_to_recovery()
    try:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=rendezvous_timeout))
    except RuntimeError as err:
        torch_compat.reset_group_count()  # the failed attempt used up a group name
        if isinstance(err, DistNetworkError):
            raise
        logger.warning("rank %d: the process group did not form: %s", rank,
                       str(err).splitlines()[0] if str(err) else type(err).__name__)
        return False
    torch_compat.set_default_group_timeout(group_timeout or default_pg_timeout)
    return True


def _leave_nccl_errors_to_recovery() -> None:
    """Set :data:`NCCL_ERROR_HANDLING` for the NCCL group about to form (torch reads it then)."""
    given = os.environ.get(TORCH_NCCL_ASYNC_ERROR_HANDLING)
    if given != NCCL_ERROR_HANDLING:
        logger.info("%s=%s for recovery's NCCL groups (it was %s): a survivor aborts its group "
                    "itself when a peer dies", TORCH_NCCL_ASYNC_ERROR_HANDLING,
                    NCCL_ERROR_HANDLING, given)
        os.environ[TORCH_NCCL_ASYNC_ERROR_HANDLING] = NCCL_ERROR_HANDLING


def retire() -> None:
    """Leave the default process group at once: an NCCL group is aborted; a gloo group's
    threads are joined in the background."""
    import torch.distributed as dist

    from recovery.runtime import torch_compat

    if dist.get_backend() == "nccl":
        torch_compat.abort_default_group()
        return
    old = [dist.group.WORLD]
    dist.destroy_process_group()  # unregisters it; ``old`` keeps the object alive
    release(old)


def release(held: list[Any]) -> None:
    """Clear ``held`` in a background thread: a process group it holds (and nothing else
    does) is destroyed there, where its destructor may wait for a collective still in
    flight on it."""

    def drop() -> None:
        held.clear()

    thread = threading.Thread(target=drop, name="tft-retire-group", daemon=True)
    _retiring.append(thread)
    thread.start()


def exit_blocked(wait: float) -> bool:
    """Whether a retired group is still blocked after waiting up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    for thread in _retiring:
        thread.join(max(deadline - time.monotonic(), 0.0))
    return any(thread.is_alive() for thread in _retiring)
