"""What the restart policy sees: one worker (:class:`RankView`) and the job at one moment
(:class:`JobView`), with the few facts derived from them that more than one rule reads."""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from launcher.config import RestartPolicy
from launcher.supervisor.actions import StopWorkers
from launcher.supervisor.failures import ExitInfo
from launcher.supervisor.state import Failure, WorkerState
from recovery.control.node_range import JobDone, NodeRange, TooFew

__all__ = ["RankView", "Ending", "JobView", "crash", "stop_all", "short_stop", "degraded",
           "RETIRED_VERDICT", "RESTART_GRACE"]

RESTART_GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL for a worker stopped by a group restart that never
registered, and for a rank stopped because it was retired or its peers finished: a script
that catches SIGTERM and keeps running (Lightning does) would otherwise hold the restart
for the whole ``--grace_period``."""

RETIRED_VERDICT = "retired"
"""The verdict on a rank the scheduler declared lost and retired at once (a straggler
evicted again soon after its relaunch, docs/stragglers.md): stopped, never relaunched."""


@dataclass(frozen=True)
class RankView:
    """One worker as the policy sees it."""

    rank: int
    state: WorkerState
    deadline: float = 0.0
    """COOLDOWN: when its relaunch is due; STOPPING: when it is to be SIGKILLed."""
    failure: Failure | None = None
    registered: bool | None = False
    """Whether its node id registered with the scheduler; None: not known yet."""
    cooldown_until: float = 0.0
    """When the scheduler lets its node id register again (read for a FAILED rank)."""
    hung: bool = False
    relaunch_why: str = ""
    step: int | None = None
    """The last step its current (or last ended) process reported; None: none."""
    failure_step: int | None = None
    """The last step the process of its failure (or ``relaunched_after``) reported."""
    relaunched_after: Failure | None = None
    """RUNNING: relaunched alone after this failure, and its new process has reported no
    step yet (it waits for a generation to join)."""
    finished_at: float | None = None
    """SUCCEEDED: when its process exited 0."""
    absent_since: float | None = None
    """When its absence began (:func:`~launcher.supervisor.absences.absent_since`); None while
    it is not absent."""
    retired: bool = False
    """Retired for good (:class:`Retire`): no longer one of the job's ranks."""
    holds_rank: bool = False
    """Relaunched alone (``relaunched_after``): the scheduler holds its new process as the
    rank's live member (it registered, perhaps still unready while it builds its model)."""


@dataclass(frozen=True)
class Ending:
    """The job is being stopped: tftrun's exit status, why, and the root cause if any."""

    status: int
    reason: str
    failing: Failure | None = None


@dataclass(frozen=True)
class JobView:
    """The job at one moment: the workers, the budget, what is pending, what came in."""

    ranks: tuple[RankView, ...]
    max_restarts: int
    restart_policy: RestartPolicy = RestartPolicy.AUTO
    restarts: int = 0
    """Group restarts carried out."""
    relaunches: int = 0
    """Single-rank relaunches carried out."""
    restart_at: float | None = None
    """A group restart is decided and due at this time."""
    ending: Ending | None = None
    signal: int | None = None
    """A signal that tftrun received (one of ``--signals_to_handle``)."""
    verdicts: Mapping[int, str] = field(default_factory=dict)
    """Ranks the scheduler declares dead or hung just now: rank → reason
    (:data:`RETIRED_VERDICT`: retired too)."""
    peer_restart: str = ""
    """Another node started a group restart this node has not: why (empty: none)."""
    peer_end: str = ""
    """Another node ended the job for every node: why (empty: it did not)."""
    peer_done: str = ""
    """Node 0's job ended well: what this node says as it ends too (empty: it did not)."""
    peer_done_at: float = 0.0
    """When (monotonic) this node learned it."""
    grace_period: float = 10.0
    node_rank: int = 0
    missing: str = ""
    """What of the other nodes is missing just now (empty: nothing)."""
    missing_since: float | None = None
    """Since when ``missing`` has been missing without a break."""
    node_time_out: float = 600.0
    other_ranks: int = 0
    """Ranks on the other nodes (0 on one node)."""
    others_finished: bool = True
    """Every rank of the other nodes finished (True on one node)."""
    others_step: int | None = None
    """The highest step the finished ranks of the other nodes reported."""
    scheduler_exit: str = ""
    """How this node's scheduler ended, when it did unexpectedly (empty: it runs)."""
    scheduler_launches: int = 0
    node_range: NodeRange | None = None
    """``--nnodes=MIN:MAX`` with MIN < MAX (None: a fixed node count)."""
    round_nodes: tuple[int, ...] = ()
    """Node 0 of an elastic job: the current generation's nodes (empty: none yet, or
    another node, which follows node 0's restarts)."""
    waiting_nodes: frozenset[int] = frozenset()
    """Node 0 of an elastic job: nodes that asked to join the next generation."""
    silent_since: Mapping[int, float] = field(default_factory=dict)
    """Node 0 of an elastic job: when each other node of the generation last beat."""
    min_worker_num: int = sys.maxsize
    """``--min_worker_num``: below the job's size, the survivors of a death train on without the
    dead rank (docs/elastic.md); at its size or above (the default), they do not."""
    rejoin_timeout: float = 60.0
    """``--rejoin_timeout``: seconds an absent rank may take to register again before it is
    retired (degraded training only)."""
    others_training: int | None = None
    """Ranks of the other nodes that train: the scheduler holds a live (or finished)
    process for them. None: not known; every one not retired counts."""
    others_retired: frozenset[int] = frozenset()
    """Ranks of the other nodes retired for good (by the scheduler's word, or by this node)."""
    lost_ranks: Mapping[int, float] = field(default_factory=dict)
    """Node 0, degraded training: ranks of other nodes that registered once, have no live
    process, and whose node's tftrun is silent (the node is lost): rank → when their node
    last beat, where their absence is dated from."""
    exits: tuple[ExitInfo, ...] = ()
    """This node's workers' exits seen in this pass."""
    unknown_to_scheduler: frozenset[int] = frozenset()
    """This node's ranks the scheduler never knew (a plain script's): their ordinary
    exits are not its business."""
    round_forming: bool = False
    """An elastic job's round is forming: no worker of this node runs yet."""
    round_outcome: TooFew | JobDone | None = None
    """An elastic job's round ended the job instead of forming a generation."""

    @property
    def charged(self) -> int:
        """Restarts charged to the budget: carried out, and decided but pending."""
        pending = (1 if self.restart_at is not None
                   else sum(r.state is WorkerState.COOLDOWN for r in self.ranks))
        return self.restarts + self.relaunches + pending


def crash(rank: RankView) -> Failure:
    """The failure that ended ``rank``'s last process (its relaunch's cause while it runs again)."""
    crash = rank.relaunched_after if rank.state is WorkerState.RUNNING else rank.failure
    assert crash is not None, f"rank {rank.rank} is {rank.state.value} without a failure"
    return crash


def stop_all(view: JobView, now: float, signum: int = signal.SIGTERM) -> StopWorkers:
    """The job's end: every running rank gets ``signum`` and the whole grace period."""
    return StopWorkers(signum, {r.rank: now + view.grace_period for r in view.ranks
                                if r.state is WorkerState.RUNNING})


def short_stop(view: JobView, now: float) -> float:
    """The SIGKILL deadline of a rank stopped that has nothing to save."""
    return now + min(view.grace_period, RESTART_GRACE)


def degraded(view: JobView) -> bool:
    """Whether the job trains on without dead ranks: ``--min_worker_num`` below its size,
    and its ranks register (a script that uses recovery; a plain script's restart all)."""
    size = len(view.ranks) + view.other_ranks
    return view.min_worker_num < size and any(r.registered for r in view.ranks)
