"""Forming and retiring a generation's process group without ever hanging (docs/architecture.md).

Members first *meet* in the store and give up once a newer generation exists, since
``init_process_group`` would wait its whole timeout for a dead member; a gloo group is
retired in a background thread, as destroying it joins threads blocked on a dead peer.
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
which would end the process, as torch asks of a process that aborts its groups itself."""
_MEET_POLL = 0.05
_retiring: list[threading.Thread] = []


def _arrival_key(rank: int) -> str:
    return f"tft/arrived/{rank}"


def meet(store: Any, rank: int, world_size: int, newer: Callable[[], bool],
         deadline: float, should_abort: ShouldAbort = never) -> bool:
    """Announce this rank in the generation's ``store`` and wait for all ``world_size``:
    True once every member arrived; False as soon as ``newer()`` says a newer generation
    exists (this one will never complete), or at ``deadline``. Raises ``DistNetworkError``
    when the scheduler's store went away, :class:`Aborted` when ``should_abort()`` says so."""
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
    """Initialise the default process group once every member has met; False when the
    rendezvous failed within ``rendezvous_timeout`` seconds (a member died meanwhile).
    ``DistNetworkError`` (the scheduler went away) is raised: the caller meets again in the
    same generation once it is back."""
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
    """Clear ``held`` in a background thread, where destroying a process group it alone
    holds may wait for a collective still in flight."""
    thread = threading.Thread(target=held.clear, name="tft-retire-group", daemon=True)
    _retiring.append(thread)
    thread.start()


def exit_blocked(wait: float) -> bool:
    """Whether a retired group is still blocked after waiting up to ``wait`` seconds; the
    process must then exit without waiting, as the C++ runtime aborts a normal exit."""
    deadline = time.monotonic() + wait
    for thread in _retiring:
        thread.join(max(deadline - time.monotonic(), 0.0))
    return any(thread.is_alive() for thread in _retiring)
