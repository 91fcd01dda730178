"""torchrun's elastic node range (``--nnodes=MIN:MAX``) for plain scripts: the pure rules.

Every group restart of an elastic job is a *round*: each node's tftrun joins it, node 0 closes it, and
the nodes it closed with form the next generation, ranked contiguously in node rank order.
launcher/nodes/rounds.py carries out :func:`close_round`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["NodeRange", "Round", "RoundWait", "Close", "Wait", "TooFew", "JobDone", "close_round",
           "MembershipWhy", "membership_why", "DEFAULT_LAST_CALL", "NODE_SILENT"]

DEFAULT_LAST_CALL = 30.0
"""Seconds a round with ``MIN`` nodes waits for more (torchrun's ``last_call_timeout``
default; ``--rdzv_conf last_call_timeout=S`` sets it)."""
NODE_SILENT = 3.0
"""Seconds without a beat from a node's tftrun (it beats every half second) after which a closing round
no longer waits for it."""


@dataclass(frozen=True)
class NodeRange:
    """``--nnodes=MIN:MAX``: the fewest and the most nodes a generation may have."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"not a node range: {self.low}:{self.high}")


@dataclass(frozen=True)
class Round:
    """One round's nodes (node ranks, ascending) and where each node's ranks start; each
    round is a group restart, its workers' ``TORCHELASTIC_RESTART_COUNT``."""

    restart_count: int
    nodes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.nodes or list(self.nodes) != sorted(set(self.nodes)):
            raise ValueError(f"a round's nodes are distinct and ascending, got {self.nodes}")

    def world(self, nproc: int) -> int:
        """``WORLD_SIZE``: every node of the round runs ``nproc`` workers."""
        return len(self.nodes) * nproc

    def first_rank(self, node: int, nproc: int) -> int:
        """The first global rank of ``node``'s workers: contiguous, in node rank order."""
        return self.nodes.index(node) * nproc

    def active(self, nproc: int) -> list[int]:
        return list(range(self.world(nproc)))


@dataclass(frozen=True)
class RoundWait:
    """A round node 0 is closing, as it stands at one moment (times are monotonic).

    ``expected``: the nodes worth waiting for: all for the first round, later the previous generation's
    and those that asked to join, less those silent for :data:`NODE_SILENT`; ``reached_at``: when
    ``MIN`` nodes first joined (None: not yet); ``disputed``: nodes whose join or beat key held a
    stranger's value (maybe one trying to join), waited for like ``expected`` up to ``time_out``.
    """

    joined: frozenset[int]
    expected: frozenset[int]
    opened_at: float
    reached_at: float | None = None
    disputed: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Close:
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class Wait:
    until: float


@dataclass(frozen=True)
class TooFew:
    """The job ends: too few nodes (or another node ended it)."""

    reason: str


@dataclass(frozen=True)
class JobDone:
    """The job ended well before this node could join it."""

    reason: str


def close_round(wait: RoundWait, span: NodeRange, now: float, last_call: float,
                time_out: float) -> Close | Wait | TooFew:
    """Close the round now (at most ``MAX`` nodes, the lowest), wait (until when), or end the job.
    ``time_out``: how long a round may stay below ``MIN`` (``--cluster_time_out``, then
    ``--node_time_out``)."""
    joined = tuple(sorted(wait.joined))[:span.high]
    if len(joined) < span.low:
        if now - wait.opened_at >= time_out:
            return TooFew(f"{len(joined)} of the job's nodes (at least {span.low} needed by "
                          f"--nnodes={span.low}:{span.high}) joined within {time_out:g}s")
        return Wait(wait.opened_at + time_out)
    if len(joined) == span.high or wait.expected | wait.disputed <= set(joined):
        return Close(joined)
    if wait.disputed - set(joined) and now - wait.opened_at < time_out:
        return Wait(wait.opened_at + time_out)
    reached = now if wait.reached_at is None else wait.reached_at
    if now - reached >= last_call:
        return Close(joined)
    return Wait(reached + last_call)


class MembershipWhy(StrEnum):
    """The ``why`` of a ``membership`` event (docs/events.md), whoever changed: the ranks of
    a degraded job (recovery/control/membership.py) or the nodes of an elastic range."""

    START = "start"
    """The job's first generation."""
    SHRINK = "shrink"
    """Some of the members before are gone and none came in: the others go on."""
    GROW = "grow"
    """Members came in (arrived, or came back) and none left."""
    REPLACE = "replace"
    """Members left and others came in, or the same ones in new processes."""


def membership_why(before: Collection[int] | None, after: Collection[int]) -> MembershipWhy:
    """Why the members went from ``before`` (None or empty: no generation yet) to ``after``."""
    if not before:
        return MembershipWhy.START
    old, new = set(before), set(after)
    if new < old:
        return MembershipWhy.SHRINK
    return MembershipWhy.GROW if new > old else MembershipWhy.REPLACE
