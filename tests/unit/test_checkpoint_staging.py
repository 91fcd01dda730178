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


def test_only_the_tensors_changed_since_the_last_save_are_copied_again() -> None:
    """A frozen layer's weights are in the buffer already; an in-place change through any
    view, a new tensor or a new layout is copied (and read back as it is now)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    stage = staging.SharedStage()

    def staged() -> tuple[Any, Any]:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "rng": torch.get_rng_state()}
        skeleton, parts = staging.split(state)
        return state, read_back(*stage.stage(parts), skeleton)

    try:
        for _ in range(2):
            model(torch.randn(5, 4)).sum().backward()
            optimizer.step()
            state, back = staged()
            assert_same(state, back)
        # Layer 1's weight and bias and their momentum changed, and the RNG state is a new
        # tensor; layer 0 (frozen, no momentum) was staged already.
        assert stage.copied == 5
        _, back = staged()
        assert stage.copied == 1  # nothing changed but the (new) RNG state tensor
        model[0].weight[0].mul_(2.0)  # in place, through a view
        state, back = staged()
        assert stage.copied == 2 and torch.equal(back["model"]["0.weight"], model[0].weight)
        with torch.no_grad():
            model[0].bias.copy_(torch.ones(3))  # as load_state_dict does
        state, back = staged()
        assert stage.copied == 2 and torch.equal(back["model"]["0.bias"], torch.ones(3))
    finally:
        stage.close()
