"""The one idiom of the project's three state machines: a ``StrEnum`` with a table
``TRANSITIONS`` (state → the states it may move to) whose ``transition(to)`` checks the move
here (drawn in docs/architecture.md). This module imports nothing of the project."""

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
    """Return if ``transitions`` lets ``current`` move to ``to``, else raise IllegalTransition
    naming ``who`` (``rank 3``, ``node 1``)."""
    if to not in transitions[current]:
        raise IllegalTransition(f"{who}: no move from {current.name} to {to.name}")
