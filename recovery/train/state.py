"""The states of :class:`recovery.train.elastic.ElasticTrainer` and their legal moves (docs/recovery.md).

A step's optimizer update happens only while the trainer is TRAINING: a move away during a step voids it.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass

from recovery.transitions import check_transition

__all__ = ["TrainerState", "TRANSITIONS", "Fault", "TrainerMachine"]

logger = logging.getLogger(__name__)


class TrainerState(enum.StrEnum):
    """Where the trainer is; the values are the names the diagram uses."""

    STARTING = "Starting"
    """Before the first step."""
    RESYNCING = "Resyncing"
    """In a freshly formed group: taking a replica's state, or rolling back to a checkpoint."""
    TRAINING = "Training"
    """Running steps."""
    PAUSED = "Paused"
    """A peer failed (or a newer generation was formed): the current step is void."""
    REPAIRING = "Repairing"
    """Some rank's device failed in this step: every rank voids it; the faulty ones take a
    healthy replica's state over the same group (UCE)."""
    SAVING_LAST_WORDS = "SavingLastWords"
    """Asking the scheduler whether this rank saves the last words, and saving them if so."""
    REFORMING = "Reforming"
    """The broken group is left; waiting for the next generation and joining its group."""
    STOPPING = "Stopping"
    """A stop signal was acted on: last words (if this rank may save them), then exit."""
    STOPPED = "Stopped"
    """The process exits (SystemExit 128 + signal)."""
    FINISHED = "Finished"
    """Every step ran."""


S = TrainerState
TRANSITIONS: dict[TrainerState, frozenset[TrainerState]] = {
    S.STARTING: frozenset({S.RESYNCING, S.TRAINING}),
    S.RESYNCING: frozenset({S.TRAINING, S.STOPPING}),
    S.TRAINING: frozenset({S.PAUSED, S.REPAIRING, S.STOPPING, S.FINISHED}),
    S.PAUSED: frozenset({S.SAVING_LAST_WORDS, S.REFORMING}),
    S.REPAIRING: frozenset({S.TRAINING, S.STOPPING}),
    S.SAVING_LAST_WORDS: frozenset({S.REFORMING, S.STOPPED}),
    S.REFORMING: frozenset({S.RESYNCING, S.STOPPING}),
    S.STOPPING: frozenset({S.SAVING_LAST_WORDS, S.STOPPED}),
    S.STOPPED: frozenset(),
    S.FINISHED: frozenset(),
}
"""Every legal move: ``TRANSITIONS[a]`` holds the states the trainer may go to from ``a``."""
del S


@dataclass(frozen=True)
class Fault:
    """Why the trainer left training: ``cause`` is one line for the log, ``at`` when this rank saw it
    (``time.time()``), ``ranks`` those whose device failed (only when repairing in place)."""

    cause: str
    at: float
    ranks: frozenset[int] = frozenset()


class TrainerMachine:
    """The current state, the fault being handled, and the only way to change them."""

    def __init__(self, rank: int) -> None:
        self.state = TrainerState.STARTING
        self.fault: Fault | None = None
        self._rank = rank

    def transition(self, to: TrainerState, fault: Fault | None = None) -> None:
        """Go to ``to``; a ``fault`` is kept until training resumes. An illegal move raises
        :class:`recovery.transitions.IllegalTransition`."""
        check_transition(TRANSITIONS, f"rank {self._rank}", self.state, to)
        logger.debug("[rank %d] %s -> %s", self._rank, self.state.name, to.name)
        self.state = to
        if fault is not None:
            self.fault = fault
        elif to is TrainerState.TRAINING:
            self.fault = None

    def fail(self, to: TrainerState, cause: str, ranks: frozenset[int] = frozenset()) -> None:
        """Leave training for ``to`` because of a fault seen now."""
        self.transition(to, Fault(cause, time.time(), ranks))
