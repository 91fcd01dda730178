"""The comm hook under the user's DDP (recovery/train/ddp_exchange.py), in a gloo group of
one rank in this process: the weight and divisor of a degraded step, the fixed buckets,
and a failed reduction that voids the step without breaking ``backward()``."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from recovery.train import ddp_exchange
from recovery.train.collective_wait import PeerFailure
from recovery.train.compute_clock import ComputeClock
from recovery.train.ddp_exchange import GradientExchange


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))


def _local_grads(inputs: torch.Tensor) -> list[torch.Tensor]:
    model = _model()
    model(inputs).square().mean().backward()
    return [p.grad.clone() for p in model.parameters()]


def _exchange(wait: Any) -> tuple[DistributedDataParallel, GradientExchange, list[str]]:
    reached: list[str] = []
    ddp = DistributedDataParallel(_model())
    return ddp, GradientExchange(ddp, wait, lambda: reached.append("collective")), reached


@pytest.mark.parametrize(("weight", "divisor"), [(1, 0), (3, 2), (2, 4)])
def test_a_step_gets_its_gradient_weighted_and_divided_as_its_plan_says(
        alone: None, weight: int, divisor: int) -> None:
    """This rank computed ``weight`` micro-batches of a step that trains ``divisor``."""
    inputs = torch.randn(4, 6)
    ddp, exchange, reached = _exchange(lambda work: work.wait())
    exchange.begin(weight, divisor)
    ddp(inputs).square().mean().backward()
    assert exchange.failure is None and reached == ["collective"]
    for got, local in zip((p.grad for p in ddp.module.parameters()), _local_grads(inputs)):
        torch.testing.assert_close(got, local * weight / (divisor or 1), rtol=0, atol=1e-7)


def test_a_lost_peer_leaves_the_step_void_and_backward_returns(alone: None) -> None:
    def lost(work: Any) -> None:
        work.wait()
        raise PeerFailure("Connection closed by peer")

    ddp, exchange, _reached = _exchange(lost)
    exchange.begin()
    ddp(torch.randn(4, 6)).square().mean().backward()  # returns: the hook's futures are answered
    assert isinstance(exchange.failure, PeerFailure)
    exchange.begin()  # the next step starts clean
    assert exchange.failure is None


def test_the_fixed_buckets_hold_the_parameters_last_first_by_dtype_and_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The layout depends on the parameters only, never on DDP's buckets: the same on a
    survivor and on a relaunched rank."""
    params = [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n, dtype in
              [(4, torch.float32), (4, torch.float32), (3, torch.float64), (8, torch.float64),
               (1, torch.float64)]]
    monkeypatch.setattr(ddp_exchange, "BUCKET_BYTES", 8 * 8)  # eight float64s
    slots: dict[int, tuple[int, int, int]] = {}
    buckets = ddp_exchange._layout(params, slots)
    assert [slots[id(p)] for p in params] == [(3, 4, 4), (3, 0, 4), (2, 0, 3), (1, 0, 8),
                                              (0, 0, 1)]
    assert [(b.flat.numel(), b.flat.dtype, b.params) for b in buckets] == [
        (1, torch.float64, 1), (8, torch.float64, 1), (3, torch.float64, 1),
        (8, torch.float32, 2)]


def test_a_steps_compute_time_leaves_out_its_wait_for_the_reductions(alone: None) -> None:
    """The straggler detector's measure under DDP: a rank that waits 0.3 s for its peers'
    buckets (here: its wait sleeps first) computed for far less; before, the whole step
    counted, so a slow rank's peers looked as slow as it."""
    clock = ComputeClock()

    def slow_peers(work: Any) -> None:
        time.sleep(0.1)
        work.wait()

    ddp = DistributedDataParallel(_model())
    exchange = GradientExchange(ddp, slow_peers, lambda: None, clock)
    clock.start()
    exchange.begin()
    started = time.monotonic()
    ddp(torch.randn(4, 6)).square().mean().backward()
    took, computed = time.monotonic() - started, clock.finished()
    assert took >= 0.1 and computed < 0.05, (took, computed)


def test_the_buffers_are_broadcast_at_the_steps_start_and_a_lost_peer_voids_it(alone: None) -> None:
    """DDP's forward would broadcast a BatchNorm's buffers, a collective outside the comm
    hook that raises in the script when a peer is gone; the exchange broadcasts them when
    the step begins instead, waiting as for its reductions."""
    waited: list[Any] = []
    peer_lost = False

    def wait(work: Any) -> None:
        work.wait()
        waited.append(work)
        if peer_lost:
            raise PeerFailure("Connection closed by peer")

    ddp = DistributedDataParallel(torch.nn.Sequential(torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 2)))
    exchange = GradientExchange(ddp, wait, lambda: None)
    assert not ddp.broadcast_buffers  # DDP's forward no longer does it
    exchange.begin()
    assert len(waited) == 2 and exchange.failure is None  # float buffers; num_batches_tracked
    peer_lost = True
    exchange.begin()
    assert len(waited) == 3 and isinstance(exchange.failure, PeerFailure)
