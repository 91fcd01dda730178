"""Staging a checkpoint's tensors in shared memory, for the writer process: a *skeleton* (each tensor a
:class:`Slot`) and the tensors copied into one reused ``memfd`` buffer, so a save costs one ``memcpy``
and a small pickle; a :class:`Rebuilder` undoes it."""

from __future__ import annotations

import ctypes
import math
import mmap
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Slot", "TensorSlots", "TensorSpec", "SharedBuffer", "SharedStage", "join", "Rebuilder"]

_ALIGN = 64


@dataclass(frozen=True)
class Slot:
    """Where the skeleton had a tensor: its index in the tensor list."""

    index: int


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's place in the buffer: byte offset, dtype and shape."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class SharedBuffer:
    """How the writer finds the buffer; ``generation`` changes whenever the buffer is replaced,
    since an fd number may be reused."""

    pid: int
    fd: int
    generation: int
    size: int


class TensorSlots:
    """Collects tensors in slot order: :meth:`take` keeps one and gives its :class:`Slot`."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []

    def take(self, tensor: torch.Tensor) -> Slot:
        self.tensors.append(tensor)
        return Slot(len(self.tensors) - 1)


def join(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """The state whose tensors :class:`TensorSlots` took out, leaving ``skeleton``, again."""
    if isinstance(skeleton, Slot):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        kind = OrderedDict if isinstance(skeleton, OrderedDict) else dict
        return kind((key, join(value, tensors)) for key, value in skeleton.items())
    if type(skeleton) in (list, tuple):
        return type(skeleton)(join(value, tensors) for value in skeleton)
    return skeleton


def _specs(tensors: list[torch.Tensor]) -> tuple[list[TensorSpec], int]:
    specs, offset = [], 0
    for tensor in tensors:
        spec = TensorSpec(offset, tensor.dtype, tuple(tensor.shape))
        specs.append(spec)
        offset += -(-spec.nbytes // _ALIGN) * _ALIGN
    return specs, max(offset, _ALIGN)


def _views(buffer: Any, specs: list[TensorSpec]) -> list[torch.Tensor]:
    """One tensor per spec on its bytes of ``buffer``, each with a storage of its own so that
    ``torch.save`` writes only that tensor's bytes."""
    return [
        torch.frombuffer(buffer, dtype=s.dtype, count=s.nbytes // s.dtype.itemsize, offset=s.offset).view(s.shape)
        if s.nbytes else torch.empty(s.shape, dtype=s.dtype)
        for s in specs
    ]


def _copy(view: torch.Tensor, tensor: torch.Tensor) -> None:
    """``view.copy_(tensor)``, as one ``memcpy`` on this thread where it can be: ``copy_`` splits
    a large copy among torch's threads, and waits for any of them that is descheduled."""
    plain = tensor.is_contiguous() and not (tensor.is_conj() or tensor.is_neg())  # no lazy conjugate
    if view.nbytes and tensor.device.type == "cpu" and tensor.dtype == view.dtype and plain:
        ctypes.memmove(view.data_ptr(), tensor.data_ptr(), view.nbytes)
    else:
        view.copy_(tensor)


@dataclass(frozen=True)
class _Staged:
    """What a slot of the buffer holds: the bytes of ``tensor`` at ``version``; the tensor is kept
    so that its memory cannot be another tensor's by the next save."""

    tensor: torch.Tensor
    version: int

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether the slot holds ``tensor``'s bytes already: the same memory, and no in-place
        change since (autograd's version counter, shared by its views)."""
        staged = self.tensor
        return (tensor.data_ptr() == staged.data_ptr() and tensor.stride() == staged.stride()
                and tensor.device == staged.device and _version(tensor) == self.version)


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter (None: it has none, an inference tensor)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


class SharedStage:
    """One shared-memory buffer, reused from save to save while the layout stays; a tensor
    unchanged since the last save (same memory and version counter) is not copied again."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._generation = 0
        self._layout: list[tuple[torch.dtype, torch.Size]] = []
        self._specs: list[TensorSpec] = []
        self._views: list[torch.Tensor] = []
        self._buffer: SharedBuffer | None = None
        self._staged: list[_Staged | None] = []
        self.copied = 0
        """Tensors the last :meth:`stage` copied (the others were in the buffer already)."""

    def stage(self, tensors: list[torch.Tensor]) -> tuple[SharedBuffer, list[TensorSpec]]:
        """Copy ``tensors`` into the buffer (a new one if their layout changed), all but those it
        holds already; the caller must know that no reader uses the buffer any more."""
        layout = [(tensor.dtype, tensor.shape) for tensor in tensors]
        if self._buffer is None or layout != self._layout:
            self._allocate(*_specs(tensors))
            self._layout = layout
            self._staged = [None] * len(tensors)
        self.copied = 0
        for index, (view, tensor) in enumerate(zip(self._views, tensors)):
            tensor = tensor.detach()
            staged = self._staged[index]
            if staged is not None and staged.holds(tensor):
                continue
            _copy(view, tensor)
            version = _version(tensor)
            self._staged[index] = None if version is None else _Staged(tensor, version)
            self.copied += 1
        assert self._buffer is not None
        return self._buffer, self._specs

    def _allocate(self, specs: list[TensorSpec], size: int) -> None:
        fd = os.memfd_create("tftrun-ckpt-stage", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        self._views = _views(mmap.mmap(fd, size), specs)  # the views keep the mapping alive
        self.close()
        self._fd, self._specs = fd, specs
        self._generation += 1
        self._buffer = SharedBuffer(os.getpid(), fd, self._generation, size)

    def close(self) -> None:
        """Let go of the buffer's fd (the mapping goes with the last view)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd, self._buffer = None, None
        self._staged = []


class Rebuilder:
    """Rebuilds the state from a mapping of the staged buffer, keeping the tensors it made on it
    for the next call on the same mapping and layout, which change rarely."""

    def __init__(self) -> None:
        self._buffer: Any = None
        self._specs: list[TensorSpec] = []
        self._views: list[torch.Tensor] = []

    def __call__(self, buffer: Any, specs: list[TensorSpec], skeleton: Any) -> Any:
        """The state again; its tensors are the buffer's bytes, not copies: valid until
        the buffer is staged again."""
        if buffer is not self._buffer or specs != self._specs:
            self._views = _views(buffer, specs)
            self._buffer, self._specs = buffer, specs
        return join(skeleton, self._views)
