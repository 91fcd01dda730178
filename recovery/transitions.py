"""The one idiom of the project's three state machines.

The supervisor's :class:`launcher.supervisor.state.WorkerState`, the scheduler's
:class:`recovery.control.members.MemberState` and the trainer's
:class:`recovery.train.state.TrainerState` are each a ``StrEnum`` with a table
``TRANSITIONS`` (state → the states it may move to) and a ``transition(to)`` method that
checks the move here first. docs/architecture.md draws the three tables; a unit test keeps
the drawings equal to them. This module imports nothing of the project.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

__all__ = ["IllegalTransition", "check_transition"]

State = TypeVar("State", bound=StrEnum)


class IllegalTransition(RuntimeError):
    """A move its machine's table does not allow: a bug, never a fault to recover from."""


def check_transition(transitions: Mapping[State, frozenset[State]], who: str, current: State,
                     to: State) -> None:
    """Return if ``transitions`` lets ``current`` move to ``to``.

    Raises:
        IllegalTransition: it does not; the message names ``who`` (``rank 3``, ``node 1``).
    """
    if to not in transitions[current]:
        raise IllegalTransition(f"{who}: no move from {current.name} to {to.name}")
