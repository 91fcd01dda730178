"""The shared-memory stage of async saves gives back exactly the state it was given."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.ckpt import staging
from recovery.ckpt.checkpoint import _plain
from recovery.ckpt.writer_process import _Mapping

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


class Reader:
    """As the writer process reads: the buffer mapped through /proc, once while it stays,
    and rebuilt by one rebuilder."""

    def __init__(self) -> None:
        self.mapping = _Mapping()
        self.rebuild = staging.Rebuilder()

    def __call__(self, buffer: staging.SharedBuffer, specs: list[staging.TensorSpec], skeleton: Any) -> Any:
        return self.rebuild(self.mapping.of(buffer), specs, skeleton)


def split(state: Any) -> tuple[Any, list[torch.Tensor]]:
    """The skeleton of ``state`` and its tensors, in slot order, as an async save takes them out."""
    slots = staging.TensorSlots()
    return _plain(state, slots.take), slots.tensors


def read_back(buffer: staging.SharedBuffer, specs: list[staging.TensorSpec], skeleton: Any) -> Any:
    """A fresh reader's: a mapping of its own."""
    return Reader()(buffer, specs, skeleton)


@settings(max_examples=25, deadline=None)
@given(first=states, second=states)
def test_staged_states_come_back_exactly_and_the_buffer_is_reused_while_the_layout_stays(
        first: Any, second: Any) -> None:
    stage = staging.SharedStage()
    try:
        skeleton, parts = split(first)
        buffer, specs = stage.stage(parts)
        assert_same(first, read_back(buffer, specs, skeleton))
        again, _ = stage.stage([part.clone() for part in parts])
        assert again == buffer  # same layout: the same buffer, not a new one
        skeleton, parts = split(second)
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
        skeleton, parts = split(state)
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


def test_one_reader_sees_each_save_of_a_reused_buffer_and_a_new_layouts_buffer() -> None:
    """The rebuilder keeps its tensors on the buffer from save to save: they show the bytes
    of the latest save, and a new buffer or layout gets tensors of its own."""
    stage, reader = staging.SharedStage(), Reader()
    weight, bias = torch.zeros(3, 4), torch.zeros(4)
    try:
        skeleton, parts = split({"w": weight, "b": bias})
        buffer, specs = stage.stage(parts)
        first = reader(buffer, specs, skeleton)
        assert torch.equal(first["w"], weight)
        weight.add_(1.5)
        bias.sub_(2)
        again, specs = stage.stage(parts)
        assert again == buffer
        second = reader(again, specs, skeleton)
        assert torch.equal(second["w"], weight) and torch.equal(second["b"], bias)
        wider = torch.arange(6.0)
        skeleton, parts = split({"w": weight, "b": wider})
        buffer, specs = stage.stage(parts)
        third = reader(buffer, specs, skeleton)
        assert torch.equal(third["w"], weight) and torch.equal(third["b"], wider)
        skeleton, parts = split({"b": bias, "w": weight})  # same buffer size, another order
        buffer, specs = stage.stage(parts)
        fourth = reader(buffer, specs, skeleton)
        assert torch.equal(fourth["w"], weight) and torch.equal(fourth["b"], bias)
    finally:
        stage.close()
