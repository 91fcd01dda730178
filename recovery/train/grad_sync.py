"""Gradient averaging with a reduction layout that never changes, for bitwise resumption.

``DistributedDataParallel`` reorders its gradient buckets after its first iteration (by
the order in which gradients became ready). A DDP built anew after a restart reduces its
first steps in the *initial* order, so float sums differ in the last bits and a resumed
run drifts away from the uninterrupted one. :func:`all_reduce_gradients` instead sums all
gradients through one flat buffer laid out in the parameters' order, which is the same in
every process, before and after any restart.
"""

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
    """Replace each gradient by its average over the ranks of ``group``.

    Call it after ``backward()`` and before ``optimizer.step()``, in place of DDP. The
    gradients are copied, in the given order, into one flat buffer per dtype, summed with
    one ``all_reduce`` each, divided by the world size and copied back. Parameters without
    a gradient are left out: every rank must have gradients for the same parameters (true
    when all ranks run the same model on the same kind of batch).

    Without an initialised process group, or with a world size of 1, it does nothing.

    Args:
        parameters: the parameters, in a fixed order (``model.parameters()`` is one).
        group: the process group; the default group if ``None``.
        wait: if given, each ``all_reduce`` is started asynchronously and ``wait(work)``
            waits for it (a fault-aware wait may raise; the gradients are then left
            untouched).
        flags: a small tensor summed over the ranks in the same collective (appended to
            the first buffer, so it costs no extra round trip, on the gradients' device);
            replaced by the sum. The trainer uses it to say which ranks' devices failed
            in this step.
        weight: what this rank's gradients are multiplied by before the sum: the
            micro-batches it computed, when a degraded step gave it more than one (its
            gradient is the mean over all its samples; recovery/train/shares.py).
        divisor: what the sum is divided by: the micro-batches of the step, never the
            ranks of a degraded group (default: the world size, as at full membership).
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
