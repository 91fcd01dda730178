"""The user's ``DistributedDataParallel``, its gradients reduced through the current generation's group
by a comm hook in fixed buckets: DDP reorders its own after its first iteration, a relaunched rank's not.
A lost peer never breaks ``backward()``: the remaining buckets come back unreduced and the step is void."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from recovery.runtime import group
from recovery.runtime.abort import Aborted
from recovery.train.collective_wait import PeerFailure
from recovery.train.compute_clock import ComputeClock

__all__ = ["BUCKET_BYTES", "GradientExchange"]

BUCKET_BYTES = 25 * 1024 * 1024
"""The fixed buckets' size, DDP's default ``bucket_cap_mb``."""


@dataclass
class _Bucket:
    """One fixed bucket: a flat buffer for a run of parameters of one dtype and device."""

    flat: torch.Tensor
    params: int
    ready: int = 0
    reduced: bool = False


@dataclass
class _Pending:
    """A DDP bucket handed to the hook, answered once its fixed buckets are reduced."""

    future: torch.futures.Future
    buffer: torch.Tensor
    gradients: list[torch.Tensor]
    slots: list[tuple[int, int, int]]
    buckets: set[int] = field(default_factory=set)


class GradientExchange:
    """The comm hook of one DDP model, made before its first backward pass, and the thread that waits for
    its reductions with ``wait`` (which raises ``PeerFailure`` or ``Aborted``). ``on_first_bucket`` marks
    the rank at its collective (progress, for the hang verdict); ``clock`` times the step's collective from
    the last gradient in to the last bucket reduced."""

    def __init__(self, ddp: torch.nn.parallel.DistributedDataParallel,
                 wait: Callable[[Any], None], on_first_bucket: Callable[[], None],
                 clock: ComputeClock | None = None) -> None:
        self._ddp = ddp
        self._wait = wait
        self._on_first_bucket = on_first_bucket
        self._clock = clock or ComputeClock()
        self._slots: dict[int, tuple[int, int, int]] = {}  # id(param) -> bucket, offset, numel
        self._buckets = _layout(ddp.module.parameters(), self._slots)
        self._pending: list[_Pending] = []
        self._next = 0  # the fixed bucket to reduce next
        self._gradients = sum(bucket.params for bucket in self._buckets)
        self._missing = self._gradients
        """The step's gradients not yet handed to the hook."""
        self._weight, self._divisor = 1, 0
        self._started = False
        self.failure: BaseException | None = None
        """What made this step's reduction fail (a ``PeerFailure`` or ``Aborted``), if it did."""
        self._buffers = list(ddp.modules_buffers) if ddp.broadcast_buffers else []
        """The buffers DDP's forward would broadcast: :meth:`begin` does it, fault-aware."""
        ddp.broadcast_buffers = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._reduce_forever, name="tft-ddp-exchange",
                                        daemon=True)
        self._thread.start()
        # A lambda: DDP checks a hook's annotations, which this module's postponed ones fail.
        ddp.register_comm_hook(self, lambda exchange, bucket: exchange._hook(bucket))

    def begin(self, weight: int = 1, divisor: int = 0) -> None:
        """Start a step: this rank's gradient counts ``weight`` times and the sum is divided by
        ``divisor`` (0: the group's size). The buffers are broadcast here, so that a lost peer
        voids the step (:attr:`failure`) where DDP's forward would have raised in the script."""
        with self._changed:
            for bucket in self._buckets:
                if self.failure is not None:
                    # A reduction left in flight on the broken group may still write here.
                    bucket.flat = torch.zeros_like(bucket.flat)
                bucket.ready, bucket.reduced = 0, False
            self._pending.clear()
            self._next = 0
            self._missing = self._gradients
            self._weight, self._divisor = weight, divisor
            self._started = False
            self.failure = None
        self._sync_buffers()

    def _sync_buffers(self) -> None:
        by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for buffer in self._buffers:
            by_kind.setdefault((buffer.dtype, buffer.device), []).append(buffer)
        for buffers in by_kind.values():
            flat = _flatten_dense_tensors(buffers)
            if not self._completed(functools.partial(dist.broadcast, flat, src=0, async_op=True)):
                return
            for buffer, synced in zip(buffers, _unflatten_dense_tensors(flat, buffers)):
                buffer.copy_(synced)

    def _hook(self, bucket: dist.GradBucket) -> torch.futures.Future:
        gradients = bucket.gradients()
        pending = _Pending(torch.futures.Future(), bucket.buffer(), gradients,
                           [self._slots[id(param)] for param in bucket.parameters()])
        if not self._started:
            self._started = True
            self._on_first_bucket()
        if len(gradients) == self._missing:  # the last: from here on the rank waits for its peers
            self._clock.collective_started()
        with self._changed:
            self._missing -= len(gradients)
            for (index, offset, numel), grad in zip(pending.slots, gradients):
                target = self._buckets[index]
                piece = target.flat[offset:offset + numel]
                piece.copy_(grad.reshape(-1))
                if self._weight != 1:
                    piece.mul_(self._weight)
                target.ready += 1
                pending.buckets.add(index)
            self._pending.append(pending)
            self._changed.notify_all()
        return pending.future

    def _reduce_forever(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._next < len(self._buckets)
                                       and self._buckets[self._next].ready
                                       == self._buckets[self._next].params)
                bucket = self._buckets[self._next]
                failed = self.failure is not None
            if not failed:
                self._reduce(bucket)
            with self._changed:
                bucket.reduced = True
                self._next += 1
                self._answer_reduced()

    def _reduce(self, bucket: _Bucket) -> None:
        if self._completed(lambda: dist.all_reduce(bucket.flat, async_op=True)):
            bucket.flat.div_(self._divisor or dist.get_world_size())

    def _completed(self, start: Callable[[], Any]) -> bool:
        """Start a collective and wait for it; False, with :attr:`failure` set, if it failed."""
        try:
            self._wait(start())
        except (PeerFailure, Aborted) as err:
            self.failure = err
            return False
        except RuntimeError as err:  # the group broke before the collective started
            self.failure = PeerFailure(str(err).splitlines()[0] if str(err) else type(err).__name__)
            return False
        return True

    def _answer_reduced(self) -> None:
        """Answer every DDP bucket whose fixed buckets are all reduced (left unreduced
        after a failure: the step is void anyway)."""
        if self._next == len(self._buckets):
            self._clock.collective_ended()  # before the last answer lets backward() return
        waiting = []
        for pending in self._pending:
            if not all(self._buckets[index].reduced for index in pending.buckets):
                waiting.append(pending)
                continue
            if self.failure is None:
                for (index, offset, numel), grad in zip(pending.slots, pending.gradients):
                    grad.view(-1).copy_(self._buckets[index].flat[offset:offset + numel])
            pending.future.set_result(pending.buffer)
        self._pending = waiting

    def follow_group(self) -> None:
        """Point DDP at the current default group; the group it held is let go of in the
        background, since a gloo group's destructor waits for a collective still in flight on it."""
        held = [self._ddp.process_group]
        self._ddp._update_process_group(dist.group.WORLD)
        group.release(held)


def _layout(parameters: Any, slots: dict[int, tuple[int, int, int]]) -> list[_Bucket]:
    """Cut the trainable parameters, last first, into buckets of one dtype and device of
    at most :data:`BUCKET_BYTES` each (a larger parameter gets one of its own)."""
    buckets: list[_Bucket] = []
    runs: list[list[torch.Tensor]] = []
    run_bytes = 0
    for param in reversed([p for p in parameters if p.requires_grad]):
        size = param.numel() * param.element_size()
        run = runs[-1] if runs else None
        if (run is not None and run[0].dtype == param.dtype and run[0].device == param.device
                and run_bytes + size <= BUCKET_BYTES):
            run.append(param)
            run_bytes += size
        else:
            runs.append([param])
            run_bytes = size
    for index, run in enumerate(runs):
        offset = 0
        for param in run:
            slots[id(param)] = (index, offset, param.numel())
            offset += param.numel()
        buckets.append(_Bucket(torch.zeros(offset, dtype=run[0].dtype, device=run[0].device),
                               len(run)))
    return buckets

