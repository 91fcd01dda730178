"""The scheduler's view of one process and of a registration's answer: the member states
and their transitions, a process's identity, and what a request is answered."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from recovery.transitions import check_transition

__all__ = [
    "Clock", "MemberState", "ENDINGS", "TRANSITIONS", "LIVE_STATES", "IN_GENERATION", "ALIVE", "FINISHED",
    "RefuseReason", "Verdict", "Identity", "Member", "NodeSeen", "Accepted", "Refused", "token_digest",
]


class Clock(Protocol):
    """The clocks: the ``time`` module, or a test's."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...


class MemberState(StrEnum):
    """Where the process holding a node id stands, as the scheduler sees it; its moves are
    :data:`TRANSITIONS`, drawn in docs/architecture.md. A LOST or HUNG member is a *verdict* for the
    supervisor to act on.
    """

    ALIVE = "alive"
    HUNG = "hung"
    UNCONFIRMED = "unconfirmed"
    LOST = "lost"
    DEAD = "dead"
    LEFT = "left"
    FINISHED = "finished"


ENDINGS = {MemberState.DEAD, MemberState.LEFT, MemberState.FINISHED}
TRANSITIONS: dict[MemberState, frozenset[MemberState]] = {
    MemberState.ALIVE: frozenset({MemberState.HUNG, MemberState.LOST, MemberState.UNCONFIRMED,
                                  *ENDINGS}),
    MemberState.HUNG: frozenset({MemberState.ALIVE, MemberState.LOST, MemberState.UNCONFIRMED,
                                 *ENDINGS}),
    MemberState.UNCONFIRMED: frozenset({MemberState.ALIVE, MemberState.LOST, *ENDINGS}),
    MemberState.LOST: frozenset({MemberState.ALIVE, *ENDINGS}),
    # An ended process may still be reported dead (the supervisor saw a non-zero exit
    # after the worker said it finished); a new process makes the node ALIVE again.
    MemberState.DEAD: frozenset({MemberState.ALIVE}),
    MemberState.LEFT: frozenset({MemberState.ALIVE, MemberState.DEAD}),
    MemberState.FINISHED: frozenset({MemberState.ALIVE, MemberState.DEAD}),
}
LIVE_STATES = frozenset({MemberState.ALIVE, MemberState.HUNG, MemberState.UNCONFIRMED})
IN_GENERATION = frozenset({MemberState.ALIVE, MemberState.UNCONFIRMED})
"""The states of a member that keeps its generation whole (a HUNG one is about to be killed)."""
ALIVE, FINISHED = MemberState.ALIVE, MemberState.FINISHED
"""For the loops over every member: a module constant is read faster than an enum's member through its
class."""


class RefuseReason(StrEnum):
    """Why a registration (or a heartbeat) was refused."""

    TOKEN = "token"
    COOLDOWN = "cooldown"
    DUPLICATE = "duplicate"
    RANK_OUT_OF_RANGE = "rank_out_of_range"
    RANK_TAKEN = "rank_taken"
    RANK_MISMATCH = "rank_mismatch"
    FULL = "full"
    STALE = "stale"


class Verdict(StrEnum):
    """Why the scheduler wants a worker killed."""

    HEARTBEAT = "heartbeat"
    PROGRESS = "progress"
    STRAGGLER = "straggler"


@dataclass(frozen=True)
class Identity:
    """One process's claim to a node id (``MS_NODE_ID``; empty: the scheduler assigns one).
    ``incarnation`` is unique per launch of a process (``TFT_INCARNATION``); ``rank`` is the one it
    asks for (``RANK``), or ``None``."""

    node_id: str
    pid: int
    incarnation: int
    host: str
    rank: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Identity:
        rank = data.get("rank")
        return cls(str(data.get("node_id") or ""), int(data["pid"]), int(data["incarnation"]),
                   str(data.get("host") or ""), None if rank is None else int(rank))


@dataclass
class Member:
    """The process that holds a node id now (or held it last)."""

    node_id: str
    rank: int
    pid: int
    incarnation: int
    host: str
    state: MemberState
    global_step: int | None = None
    """The step it reported last (its heartbeat's ``step``)."""
    phase: str | None = None  # what the training loop says it is doing, as it says it
    heartbeat_at: float = 0.0  # monotonic
    progress_at: float = 0.0  # monotonic: its start, its generation forming or its new step
    # The step it reported since its generation formed (None: none yet), and since when
    # another member of the generation has reported a higher one (monotonic).
    generation_step: int | None = None
    behind_since: float | None = None
    least_delay: float | None = None
    """The least (scheduler's wall clock - a request's signed stamp) seen from this
    process: its clock's offset from the scheduler's, plus the quickest delivery."""
    ready: bool = True
    """Whether it may be put in a generation: a relaunched rank registers unready until its training
    loop can take a live rank's state, and the others train on meanwhile."""
    via: str | None = None
    """The node whose supervisor beats for it (``node_beat``); None: it beats itself."""
    whole: bool = False
    """It trains in whole generations only (``@recovery.restartable``): no cooldown."""

    def is_process(self, pid: int, incarnation: int, host: str | None = None) -> bool:
        return (self.pid == pid and self.incarnation == incarnation
                and (host is None or self.host == host))

    def transition(self, to: MemberState) -> None:
        check_transition(TRANSITIONS, f"node {self.node_id}", self.state, to)
        self.state = to

    def fields(self) -> dict[str, Any]:
        """The fields events carry about this member."""
        return {"node_id": self.node_id, "rank": self.rank, "pid": self.pid,
                "incarnation": self.incarnation}

    def to_json(self) -> dict[str, Any]:
        """The persisted member; its step is stored as ``step``, the name the state files and ``tftctl
        status`` use."""
        return {**self.fields(), "host": self.host, "state": self.state.value,
                "step": self.global_step, "phase": self.phase,
                "generation_step": self.generation_step, "ready": self.ready}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Member:
        return cls(str(data["node_id"]), int(data["rank"]), int(data["pid"]),
                   int(data["incarnation"]), str(data["host"]), MemberState(data["state"]),
                   data.get("step"), data.get("phase"),
                   generation_step=data.get("generation_step"), ready=data.get("ready", True))


@dataclass
class NodeSeen:
    """A node whose supervisor beats for its ranks (``node_beat``), as last heard."""

    heard_at: float
    """Monotonic: its latest beat."""
    beats: int = 0
    ranks: int = 0
    """How many ranks its latest beat carried."""
    judged: bool = False
    """Declared silent since its latest beat."""


@dataclass(frozen=True)
class Accepted:
    """The process holds ``node_id`` with ``rank``; it joins ``generation``.

    ``fault_at``: when the scheduler heard of the newest fault, which a rank's recovery is timed from.
    """

    node_id: str
    rank: int
    generation: int
    fault_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "node_id": self.node_id, "rank": self.rank,
                "generation": self.generation, "fault_at": self.fault_at}


@dataclass(frozen=True)
class Refused:
    """Not accepted; ``retry_after`` seconds when trying again may succeed, else ``None``."""

    reason: RefuseReason
    message: str
    retry_after: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"ok": False, "reason": self.reason.value, "message": self.message,
                "retry_after": self.retry_after}


def token_digest(token: str) -> str:
    """What is persisted instead of the token: enough to tell another job's state apart."""
    return hashlib.sha256(token.encode()).hexdigest()
