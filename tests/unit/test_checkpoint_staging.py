"""The shared-memory stage of async saves gives back exactly the state it was given."""

from __future__ import annotations

import mmap
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.ckpt import staging

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.uint8, torch.bool]


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    dtype = draw(st.sampled_from(DTYPES))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    tensor = (torch.rand(shape, generator=generator) * 100).to(dtype)
    return tensor.t() if tensor.dim() == 2 and draw(st.booleans()) else tensor  # not contiguous


states = st.recursive(
    tensors() | st.integers() | st.text(max_size=3) | st.none(),
    lambda children: st.lists(children, max_size=3) | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=8,
)


def assert_same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        assert b.untyped_storage().nbytes() == b.numel() * b.element_size()  # a storage of its own
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def read_back(buffer: staging.SharedBuffer, specs: list[staging.TensorSpec], skeleton: Any) -> Any:
    """As the writer process does: map the buffer through /proc and rebuild."""
    with open(f"/proc/{buffer.pid}/fd/{buffer.fd}", "r+b") as file:
        return staging.rebuild(mmap.mmap(file.fileno(), buffer.size), specs, skeleton)


@settings(max_examples=25, deadline=None)
@given(first=states, second=states)
def test_staged_states_come_back_exactly_and_the_buffer_is_reused_while_the_layout_stays(
        first: Any, second: Any) -> None:
    stage = staging.SharedStage()
    try:
        skeleton, parts = staging.split(first)
        buffer, specs = stage.stage(parts)
        assert_same(first, read_back(buffer, specs, skeleton))
        again, _ = stage.stage([part.clone() for part in parts])
        assert again == buffer  # same layout: the same buffer, not a new one
        skeleton, parts = staging.split(second)
        buffer, specs = stage.stage(parts)
        assert_same(second, read_back(buffer, specs, skeleton))
    finally:
        stage.close()
