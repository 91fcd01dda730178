"""Gradient averaging with a reduction layout that never changes, for bitwise resumption: DDP reorders
its buckets after its first iteration, so a DDP built anew after a restart sums in another order."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_reduce_gradients"]


def all_reduce_gradients(
    parameters: Iterable[torch.nn.Parameter],
    group: dist.ProcessGroup | None = None,
    wait: Callable[[Any], None] | None = None,
    flags: torch.Tensor | None = None,
    weight: int = 1,
    divisor: int | None = None,
) -> None:
    """Replace each gradient by its average over the ranks of ``group``; without a process group, do nothing.

    Call it after ``backward()`` and before ``optimizer.step()``, in place of DDP. Every rank must have
    gradients for the same parameters (those without one are left out).

    Args:
        parameters: in a fixed order (``model.parameters()`` is one).
        wait: if given, each ``all_reduce`` is started asynchronously and ``wait(work)`` waits for it;
            if it raises, the gradients are left untouched.
        flags: a small tensor summed over the ranks in the same collective, and replaced by the sum.
        weight: multiplies this rank's gradients before the sum: its micro-batches in a degraded step.
        divisor: divides the sum: the step's micro-batches, never a degraded group's ranks (default: the
            world size).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    world_size = dist.get_world_size(group)
    divisor = world_size if divisor is None else divisor
    if world_size == 1 and weight == divisor == 1:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for param in parameters:
        if param.grad is not None:
            by_dtype.setdefault(param.grad.dtype, []).append(param.grad)
    for index, grads in enumerate(by_dtype.values()):
        extra = [flags.to(grads[0].device, grads[0].dtype)] if flags is not None and index == 0 else []
        flat = torch.cat([grad.reshape(-1) for grad in grads] + extra)
        if weight != 1:
            flat[:flat.numel() - sum(t.numel() for t in extra)].mul_(weight)
        if world_size > 1 and wait is None:
            dist.all_reduce(flat, group=group)
        elif world_size > 1:
            wait(dist.all_reduce(flat, group=group, async_op=True))
        if extra:
            flags.copy_(flat[-flags.numel():])
            flat = flat[:-flags.numel()]
        flat.div_(divisor)
        for grad, reduced in zip(grads, flat.split([grad.numel() for grad in grads])):
            grad.copy_(reduced.view_as(grad))
