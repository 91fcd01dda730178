"""The three state machines share one idiom, and docs/architecture.md draws each exactly.

The supervisor's ``WorkerState``, the scheduler's ``MemberState`` and the trainer's
``TrainerState``: each a ``StrEnum`` with a ``TRANSITIONS`` table and a ``transition(to)``
method that raises the one :class:`recovery.transitions.IllegalTransition`. Every diagram of
a machine (its section in docs/architecture.md, and the trainer's in docs/recovery.md too)
draws exactly its table's arrows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

from launcher.supervisor import state as supervisor
from recovery.control import members
from recovery.train import state as trainer
from recovery.transitions import IllegalTransition

DOCS = Path(__file__).resolve().parents[2] / "docs"
EDGE = re.compile(r"^\s*(\w+|\[\*\])\s*-->\s*(\w+|\[\*\])\s*(?::.*)?$")


@dataclass(frozen=True)
class Machine:
    name: str
    states: type[StrEnum]
    table: Mapping[Any, frozenset[Any]]
    initial: StrEnum
    holder: Callable[[Any], Any]
    """A holder of the machine (Worker, Member, TrainerMachine) in the given state."""
    drawn: tuple[tuple[str, str], ...]
    """(page in docs/, the heading its diagram follows)."""


def _trainer_in(state: trainer.TrainerState) -> trainer.TrainerMachine:
    machine = trainer.TrainerMachine(rank=0)
    machine.state = state
    return machine


MACHINES = [
    Machine("supervisor", supervisor.WorkerState, supervisor.TRANSITIONS,
            supervisor.WorkerState.PENDING,
            lambda s: supervisor.Worker(rank=0, local_rank=0, state=s),
            (("architecture.md", "### The supervisor's workers: `WorkerState`"),)),
    Machine("scheduler", members.MemberState, members.TRANSITIONS,
            members.MemberState.ALIVE,
            lambda s: members.Member("0", 0, 100, 0, "h", s),
            (("architecture.md", "### The scheduler's members: `MemberState`"),)),
    Machine("trainer", trainer.TrainerState, trainer.TRANSITIONS,
            trainer.TrainerState.STARTING, _trainer_in,
            (("architecture.md", "### The trainer: `TrainerState`"),
             ("recovery.md", "## The trainer's states"))),
]
BY_NAME = pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)


def diagram_edges(page: str, heading: str) -> set[tuple[str, str]]:
    """The arrows of the first ``stateDiagram-v2`` after ``heading`` on ``page``."""
    text = (DOCS / page).read_text()
    section = text[text.index(f"\n{heading}\n"):]
    body = section[section.index("```mermaid"):]
    body = body[:body.index("```", 3)]
    assert "stateDiagram-v2" in body
    return {(m[1], m[2]) for line in body.splitlines() if (m := EDGE.match(line))}


@BY_NAME
def test_every_diagram_draws_exactly_the_table(machine: Machine) -> None:
    table = {(a.value, b.value) for a, targets in machine.table.items() for b in targets}
    finals = {s.value for s, targets in machine.table.items() if not targets}
    for page, heading in machine.drawn:
        edges = diagram_edges(page, heading)
        assert {(a, b) for a, b in edges if "[*]" not in (a, b)} == table, (page, heading)
        assert {b for a, b in edges if a == "[*]"} == {machine.initial.value}, (page, heading)
        assert {a for a, b in edges if b == "[*]"} == finals, (page, heading)


@BY_NAME
def test_one_shape_a_strenum_and_a_table_of_every_state(machine: Machine) -> None:
    assert issubclass(machine.states, StrEnum)
    assert set(machine.table) == set(machine.states)
    assert all(isinstance(targets, frozenset) for targets in machine.table.values())


@BY_NAME
def test_every_state_is_reachable_from_the_first(machine: Machine) -> None:
    reachable, frontier = {machine.initial}, [machine.initial]
    while frontier:
        for nxt in machine.table[frontier.pop()] - reachable:
            reachable.add(nxt)
            frontier.append(nxt)
    assert reachable == set(machine.states)


@BY_NAME
def test_transition_moves_exactly_along_the_table_and_else_raises_the_one_error(
        machine: Machine) -> None:
    for current in machine.states:
        for to in machine.states:
            holder = machine.holder(current)
            if to in machine.table[current]:
                holder.transition(to)
                assert holder.state is to
            else:
                with pytest.raises(IllegalTransition,
                                   match=f": no move from {current.name} to {to.name}$"):
                    holder.transition(to)
                assert holder.state is current
