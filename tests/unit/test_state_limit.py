"""The bound a rank puts on a replica's state before room is made for it
(recovery/train/replica.py): an honest peer's state always fits, even into a newcomer
whose optimizer holds nothing yet; one a few times the rank's own does not."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch

from recovery.train.replica import STATE_SLACK, state_limit


def saved_bytes(state: dict[str, Any]) -> int:
    out = io.BytesIO()
    torch.save(state, out)
    return len(out.getvalue())


def trainer(optimizer: type[torch.optim.Optimizer], steps: int) -> dict[str, Any]:
    """The model and optimizer state of a rank after ``steps`` steps (0: a newcomer's)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.BatchNorm1d(1024),
                                torch.nn.Linear(1024, 1024))
    opt = optimizer(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 1024)).square().mean().backward()
        opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "position": {"step": steps}}


@pytest.mark.parametrize("optimizer", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD])
def test_a_trained_peers_state_fits_the_bound_of_a_newcomer_and_of_a_trained_rank(
        optimizer: type[torch.optim.Optimizer]) -> None:
    sent = saved_bytes(trainer(optimizer, 3))
    assert sent <= state_limit(trainer(optimizer, 0))
    assert sent <= state_limit(trainer(optimizer, 3))


def test_a_state_three_times_a_trained_ranks_own_is_past_its_bound() -> None:
    own = trainer(torch.optim.Adam, 1)
    assert saved_bytes(own) > 3 * STATE_SLACK  # the slack is small beside the state
    assert state_limit(own) < 3 * saved_bytes(own)


def test_a_storage_shared_by_several_tensors_counts_once() -> None:
    flat = torch.zeros(1 << 20)
    views = {"model": {"a": flat[:10], "b": flat[10:20]}, "optimizer": None}
    assert state_limit(views) == 2 * (flat.nbytes + 2 * flat.nbytes) + STATE_SLACK
