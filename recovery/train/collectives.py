"""The few collectives recovery runs outside the gradient all-reduce, as waitable ones.

torch's object collectives (``all_gather_object``, ``broadcast_object_list``) block until
they complete, so a member that freezes in the middle of a resynchronisation holds the
others for the whole group timeout, deaf to a newer generation and to a stop signal.
These run the same exchanges as asynchronous tensor collectives and hand each one to a
:data:`Wait` (the trainer's polls the generation and ``should_abort()``, like the
gradient all-reduce's).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Wait", "blocking", "all_gather_rows", "broadcast_object"]

Wait = Callable[[Any], None]
"""Waits for an asynchronous collective's work (it may raise to give up on it)."""


def blocking(work: Any) -> None:
    """The plain :data:`Wait`: until the collective completes."""
    work.wait()


def all_gather_rows(rows: list[tuple[int, ...]], width: int,
                    wait: Wait = blocking) -> list[list[tuple[int, ...]]]:
    """Every rank's list of integer tuples of ``width`` items, in rank order."""
    world_size = dist.get_world_size()
    count = torch.tensor([len(rows)], dtype=torch.int64)
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    wait(dist.all_gather(counts, count, async_op=True))
    longest = max(int(c) for c in counts)
    if longest == 0:
        return [[] for _ in range(world_size)]  # every rank knows it: no second collective
    mine = torch.zeros((longest, width), dtype=torch.int64)
    if rows:
        mine[:len(rows)] = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), width)
    everyone = [torch.zeros_like(mine) for _ in range(world_size)]
    wait(dist.all_gather(everyone, mine, async_op=True))
    return [[tuple(row) for row in table[:int(n)].tolist()] for table, n in zip(everyone, counts)]


def broadcast_object(value: Any, source: int, wait: Wait = blocking) -> Any:
    """Send a picklable ``value`` from rank ``source`` to every rank; returns it everywhere.

    ``value`` is only read on the source (pass ``None`` elsewhere); the source gets back
    the very object it passed.
    """
    if dist.get_rank() == source:
        payload = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    wait(dist.broadcast(size, src=source, async_op=True))
    if dist.get_rank() != source:
        payload = torch.empty(int(size), dtype=torch.uint8)
    wait(dist.broadcast(payload, src=source, async_op=True))
    return value if dist.get_rank() == source else pickle.loads(payload.numpy().tobytes())
