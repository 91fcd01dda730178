"""The trainer's state machine and its fault (its table and diagrams: test_state_machines.py);
the shared should_abort() of waits; the torch version the private calls were written for."""

from __future__ import annotations

import re
import time

import pytest
import torch.distributed as dist

from recovery.runtime import group
from recovery.runtime.abort import Aborted
from recovery.runtime.torch_compat import TorchVersionError, check_version
from recovery.train.state import TRANSITIONS, TrainerMachine, TrainerState
from recovery.transitions import IllegalTransition


def test_the_trainer_ends_only_stopped_or_finished() -> None:
    finals = {s for s, targets in TRANSITIONS.items() if not targets}
    assert finals == {TrainerState.STOPPED, TrainerState.FINISHED}


def test_a_move_outside_the_table_raises_and_leaves_the_state() -> None:
    machine = TrainerMachine(rank=3)
    machine.transition(TrainerState.TRAINING)
    with pytest.raises(IllegalTransition, match="rank 3: no move from TRAINING to RESYNCING"):
        machine.transition(TrainerState.RESYNCING)
    assert machine.state is TrainerState.TRAINING


def test_a_fault_is_kept_until_training_resumes() -> None:
    machine = TrainerMachine(rank=0)
    machine.transition(TrainerState.TRAINING)
    machine.fail(TrainerState.REPAIRING, "a device failed", frozenset({1}))
    assert machine.fault is not None and machine.fault.ranks == {1}
    machine.transition(TrainerState.TRAINING)
    assert machine.fault is None
    machine.fail(TrainerState.PAUSED, "peer gone")
    machine.transition(TrainerState.REFORMING)
    machine.transition(TrainerState.RESYNCING)
    assert machine.fault is not None and machine.fault.cause == "peer gone"


def test_meeting_a_generation_gives_up_when_asked_to() -> None:
    store = dist.HashStore()
    started = time.monotonic()
    with pytest.raises(Aborted):
        group.meet(store, 0, 2, newer=lambda: False, deadline=started + 30,
                   should_abort=lambda: time.monotonic() - started > 0.2)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("version", ["2.13.0+cpu", "2.13.1", "2.13.0a0+git1234"])
def test_the_torch_release_the_private_calls_were_written_for_passes(version: str) -> None:
    check_version(version)


@pytest.mark.parametrize("version", ["2.12.1", "2.14.0+cu124", "3.0", "nightly"])
def test_another_torch_release_fails_clearly(version: str) -> None:
    with pytest.raises(TorchVersionError, match=f"torch {re.escape(version)} is installed"):
        check_version(version)
