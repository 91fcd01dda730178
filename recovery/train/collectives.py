"""The few collectives recovery runs outside the gradient all-reduce, as waitable ones: torch's object
collectives block (a frozen member holds the others for the whole group timeout) and unpickle what a
peer sends; these are asynchronous and load what they receive with ``weights_only=True``."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import psutil
import torch
import torch.distributed as dist

__all__ = ["Wait", "RefusedPayload", "MAX_ROWS", "blocking", "all_gather_rows", "broadcast_plain"]

Wait = Callable[[Any], None]
"""Waits for an asynchronous collective's work (it may raise to give up on it)."""


MAX_ROWS = 4096
"""The most rows a peer may announce to :func:`all_gather_rows` unless the caller expects fewer,
so that a false count never chooses an allocation."""


class RefusedPayload(Exception):
    """A peer sent state that does not load as tensors and plain data, or announced more
    than an honest peer sends: nothing of it was loaded, nor room made for it."""


def blocking(work: Any) -> None:
    """The plain :data:`Wait`: until the collective completes."""
    work.wait()


def all_gather_rows(rows: list[tuple[int, ...]], width: int, wait: Wait = blocking,
                    most: int = MAX_ROWS) -> list[list[tuple[int, ...]]]:
    """Every rank's list of integer tuples of ``width`` items, in rank order; a peer announcing more than
    ``most`` rows raises :class:`RefusedPayload` on every rank alike, before anything is allocated."""
    if len(rows) > most:
        raise ValueError(f"{len(rows)} rows to gather, more than the {most} a rank may send")
    world_size = dist.get_world_size()
    count = torch.tensor([len(rows)], dtype=torch.int64)
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    wait(dist.all_gather(counts, count, async_op=True))
    for peer, announced in enumerate(int(c) for c in counts):
        if not 0 <= announced <= most:
            raise RefusedPayload(f"rank {peer} announced {announced} rows; a rank sends at most {most}")
    longest = max(int(c) for c in counts)
    if longest == 0:
        return [[] for _ in range(world_size)]  # every rank knows it: no second collective
    mine = torch.zeros((longest, width), dtype=torch.int64)
    if rows:
        mine[:len(rows)] = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), width)
    everyone = [torch.zeros_like(mine) for _ in range(world_size)]
    wait(dist.all_gather(everyone, mine, async_op=True))
    return [[tuple(row) for row in table[:int(n)].tolist()] for table, n in zip(everyone, counts)]


def broadcast_plain(value: Any, source: int, most: int, wait: Wait = blocking) -> Any:
    """Send ``value`` (tensors and plain data, read only on the source) from rank ``source`` to every rank;
    return it everywhere, the source's very object there. A receiver raises :class:`RefusedPayload`
    (before allocating) for a length over ``most`` or this host's free memory, or for what
    ``weights_only`` refuses."""
    if dist.get_rank() == source:
        out = io.BytesIO()
        torch.save(value, out)
        buffer = bytearray(out.getvalue())
        size = torch.tensor([len(buffer)], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    wait(dist.broadcast(size, src=source, async_op=True))
    if dist.get_rank() != source:
        announced = int(size)
        available = psutil.virtual_memory().available
        if not 0 < announced <= min(most, available):
            # Refused before allocating: a size past what this host holds would end in a
            # MemoryError or, under overcommit, in the OOM killer choosing among the ranks.
            raise RefusedPayload(f"rank {source} announced {announced} bytes; this rank accepts "
                                 f"at most {most} ({available} available here)")
        buffer = bytearray(announced)
    wait(dist.broadcast(torch.frombuffer(buffer, dtype=torch.uint8), src=source, async_op=True))
    if dist.get_rank() == source:
        return value
    try:
        return torch.load(io.BytesIO(buffer), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - whatever fails to load is refused the same
        first_line = (str(err).splitlines() or [type(err).__name__])[0]
        raise RefusedPayload(f"rank {source} sent state that does not load as tensors and "
                             f"plain data (weights_only=True): {first_line}") from None
