"""The trainer's state machine: its table, the diagram in docs/recovery.md, its checks;
the shared should_abort() of waits; the torch version the private calls were written for."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from recovery.runtime import group
from recovery.runtime.abort import Aborted
from recovery.runtime.torch_compat import TorchVersionError, check_version
from recovery.train.state import TRANSITIONS, TrainerMachine, TrainerState
from recovery.transitions import IllegalTransition

DOC = Path(__file__).resolve().parents[2] / "docs" / "recovery.md"
EDGE = re.compile(r"^\s*(\w+|\[\*\])\s*-->\s*(\w+|\[\*\])\s*(?::.*)?$")


def diagram_edges() -> set[tuple[str, str]]:
    """The arrows of the trainer's ``stateDiagram-v2`` in docs/recovery.md."""
    text = DOC.read_text()
    section = text[text.index("## The trainer's states"):]
    body = section[section.index("```mermaid"):]
    body = body[:body.index("```", 3)]
    assert "stateDiagram-v2" in body
    return {(m[1], m[2]) for line in body.splitlines() if (m := EDGE.match(line))}


def test_the_diagram_draws_exactly_the_transition_table() -> None:
    edges = diagram_edges()
    table = {(a.value, b.value) for a, targets in TRANSITIONS.items() for b in targets}
    drawn = {(a, b) for a, b in edges if "[*]" not in (a, b)}
    assert drawn == table
    assert ("[*]", TrainerState.STARTING.value) in edges
    finals = {a for a, b in edges if b == "[*]"}
    assert finals == {s.value for s, targets in TRANSITIONS.items() if not targets}


def test_every_state_is_reachable_and_every_path_can_end() -> None:
    reachable, frontier = {TrainerState.STARTING}, [TrainerState.STARTING]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()] - reachable:
            reachable.add(nxt)
            frontier.append(nxt)
    assert reachable == set(TrainerState)
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
