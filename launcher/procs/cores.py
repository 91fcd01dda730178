"""msrun's ``--bind_core``: each worker of a node pinned to its own share of the node's cores."""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["node_cores", "share_of", "pin"]


def node_cores() -> tuple[int, ...]:
    """The cores this process may run on, in order: the ones its workers share out."""
    return tuple(sorted(os.sched_getaffinity(0)))


def share_of(cores: Sequence[int], nproc: int, local_rank: int) -> frozenset[int]:
    """Local rank ``local_rank``'s cores of ``nproc`` workers: consecutive blocks whose sizes
    differ by one at most; with fewer cores than workers, one core each, in turn."""
    if not cores or not 0 <= local_rank < nproc:
        raise ValueError(f"no share of {len(cores)} cores for local rank {local_rank} of {nproc}")
    if nproc >= len(cores):
        return frozenset({cores[local_rank % len(cores)]})
    size, extra = divmod(len(cores), nproc)
    start = local_rank * size + min(local_rank, extra)
    return frozenset(cores[start:start + size + (local_rank < extra)])


def pin(pid: int, cores: frozenset[int]) -> None:
    """Pin every thread of process ``pid`` to ``cores``; the threads it starts later inherit
    it. A process or thread that is already gone is skipped."""
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return
    for tid in sorted(threads, key=lambda t: t != pid):  # the main thread first
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:
            continue
