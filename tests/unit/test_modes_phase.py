"""MS_ENABLE_TFT parsing, the optimizer's phase tracking, and the choice of a replica."""

from __future__ import annotations

import pytest
import torch

from recovery.faults import DeviceError, is_recoverable_device_error
from recovery.train.modes import ALL_ON, TftModes, parse_enable_tft
from recovery.train.phase import COMPUTING, DONE, UPDATING, phase_of, wrap_optimizer
from recovery.train.replica import ReplicaReport, choose_source


@pytest.mark.parametrize(("text", "modes"), [
    (None, ALL_ON),
    ("", ALL_ON),
    ("{TTP:1,UCE:1,ARF:1}", TftModes(True, True, True)),
    ("{TTP:1}", TftModes(ttp=True, uce=False, arf=False)),
    (" { arf : 1 , ttp:0 } ", TftModes(ttp=False, uce=False, arf=True)),
    ("{TTP:0,UCE:1,ARF:0,HCCE:1}", TftModes(ttp=False, uce=True, arf=False)),
])
def test_enable_tft_reads_msruns_syntax(text: str | None, modes: TftModes) -> None:
    assert parse_enable_tft(text) == modes


@pytest.mark.parametrize("text", ["TTP:1", "{TTP:2}", "{TTP}", "{XYZ:1}", "{TTP:1;ARF:1}"])
def test_enable_tft_rejects_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match="MS_ENABLE_TFT"):
        parse_enable_tft(text)


def _model_and_optimizer() -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    model(torch.ones(3, 4)).sum().backward()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_wrapped_step_reports_updating_then_done() -> None:
    model, optimizer = _model_and_optimizer()
    seen: list[str] = []
    tracker = phase_of(optimizer)
    tracker.listener = seen.append
    tracker.start_step(7)
    assert tracker.consistent and tracker.global_step == 7
    before = model.weight.detach().clone()
    optimizer.step()
    assert seen == [COMPUTING, UPDATING, DONE]
    assert not torch.equal(model.weight, before)
    assert wrap_optimizer(optimizer) is optimizer and phase_of(optimizer) is tracker


def test_a_void_step_leaves_the_parameters_alone() -> None:
    model, optimizer = _model_and_optimizer()
    tracker = phase_of(optimizer)
    tracker.start_step(1)
    tracker.void_when = lambda: True
    before = model.weight.detach().clone()
    optimizer.step()
    assert torch.equal(model.weight, before) and tracker.phase == COMPUTING


class HalfwayFailingSGD(torch.optim.SGD):
    """Updates its first parameter, then its device fails: a half-updated state."""

    def step(self, closure=None):  # type: ignore[no-untyped-def,override]
        first = self.param_groups[0]["params"][0]
        with torch.no_grad():
            first.sub_(first.grad, alpha=0.1)
        raise DeviceError("uncorrectable error in the middle of the update")


def test_a_device_error_mid_update_marks_the_replica_inconsistent() -> None:
    model = torch.nn.Linear(4, 2)
    model(torch.ones(3, 4)).sum().backward()
    optimizer = HalfwayFailingSGD(model.parameters(), lr=0.1)
    tracker = phase_of(optimizer)
    tracker.start_step(3)
    optimizer.step()  # caught: the rank lives on
    assert tracker.phase == UPDATING and not tracker.consistent
    assert isinstance(tracker.device_error, DeviceError)


def test_an_ordinary_error_in_the_update_still_raises() -> None:
    model, optimizer = _model_and_optimizer()
    optimizer.param_groups[0]["lr"] = "not a number"
    with pytest.raises(TypeError):
        optimizer.step() if phase_of(optimizer) else None


def test_recoverable_device_errors_are_named_by_their_cuda_error() -> None:
    assert is_recoverable_device_error(DeviceError("x"))
    assert is_recoverable_device_error(RuntimeError("CUDA error: uncorrectable ECC error encountered"))
    assert not is_recoverable_device_error(RuntimeError("CUDA error: out of memory"))
    assert not is_recoverable_device_error(ValueError("uncorrectable ECC error encountered"))


def test_the_source_is_the_newest_consistent_replica_lowest_rank_first() -> None:
    reports = [ReplicaReport(0, False, -1), ReplicaReport(1, True, 39), ReplicaReport(2, True, 40),
               ReplicaReport(3, True, 40)]
    assert choose_source(reports) == reports[2]
    assert choose_source(reports, excluded=frozenset({2})) == reports[3]
    assert choose_source([ReplicaReport(0, False, 5), ReplicaReport(1, False, 5)]) is None
