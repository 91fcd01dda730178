"""Degraded training's rules: which ranks are absent, when one is retired, and when too
few train for the job to go on (docs/elastic.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from launcher.supervisor.actions import EXIT_PEER_ENDED, Action, GiveUp, Retire, Stop, WaitUntil
from launcher.supervisor.job_view import JobView, RankView, crash, degraded, short_stop, stop_all
from launcher.supervisor.state import Failure, WorkerState

__all__ = ["absent_since", "absences", "absent_ranks", "absence_deadlines"]


def absent_since(before: float | None, rank: RankView) -> float | None:
    """When ``rank``'s absence began (``before``: as of the last pass, None: not absent):
    the time of the failure that began it, kept while it stays absent; None once it is back
    or stopped."""
    if rank.retired:
        return None
    if rank.state in (WorkerState.FAILED, WorkerState.COOLDOWN) or (
            rank.state is WorkerState.RUNNING and rank.relaunched_after is not None
            and not rank.holds_rank):
        return before if before is not None else crash(rank).at
    return None


@dataclass(frozen=True)
class _Absence:
    """A rank absent (degraded training): since when, and why."""

    rank: int
    since: float
    why: str
    failure: Failure | None
    """This node's rank: the crash that began its absence; None: another node's rank, lost
    with its node."""


def _training(view: JobView, absent: Sequence[_Absence]) -> int:
    """How many ranks train while ``absent`` are away, on this node and the others."""
    own = len(view.ranks) - sum(r.retired for r in view.ranks) - sum(
        a.failure is not None for a in absent)
    others = (view.other_ranks - len(view.others_retired) if view.others_training is None
              else view.others_training)
    return own + others


def absent_ranks(view: JobView) -> list[_Absence]:
    """This node's absent ranks, and the lost ranks of other nodes that node 0 judges."""
    own = [_Absence(r.rank, r.absent_since, crash(r).reason, crash(r)) for r in view.ranks
           if r.absent_since is not None and not r.retired]
    lost = [_Absence(rank, since, "its node's tftrun went silent", None)
            for rank, since in sorted(view.lost_ranks.items()) if rank not in view.others_retired]
    return own + lost


def absences(view: JobView, now: float) -> list[Action] | None:
    """Degraded training: retire the ranks absent for ``--rejoin_timeout`` while at least
    ``--min_worker_num`` train; with fewer, end the job once that lasted
    ``--node_time_out``, or at once when none of them can come back."""
    absent = absent_ranks(view)
    if not absent or view.restart_at is not None or not degraded(view):
        return None
    training = _training(view, absent)
    if training >= view.min_worker_num:
        due = [a for a in absent if now >= a.since + view.rejoin_timeout]
        if not due:
            return None
        return [*(Retire(a.rank, f"rank {a.rank} ({a.why}) was not back within "
                                 f"--rejoin_timeout={view.rejoin_timeout:g}s", short_stop(view, now))
                  for a in due),
                WaitUntil(now)]
    first = min(absent, key=lambda a: a.since)
    too_few = (f"{training} of {len(view.ranks) + view.other_ranks} ranks train, fewer than "
               f"--min_worker_num={view.min_worker_num}, and ranks {sorted(a.rank for a in absent)}")
    if _none_can_return(view, absent):
        assert first.failure is not None
        return [GiveUp(first.failure, f"{too_few} cannot be relaunched; restart budget ({view.max_restarts}) spent"),
                stop_all(view, now)]
    if now < _too_few_since(view, absent) + view.node_time_out:
        return None
    reason = f"{too_few} were not back within --node_time_out={view.node_time_out:g}s"
    if first.failure is None:  # another node's: this node ends the job for every node
        return [Stop(EXIT_PEER_ENDED, f"node {view.node_rank}: {reason}", everywhere=True),
                stop_all(view, now)]
    return [GiveUp(first.failure, reason), stop_all(view, now)]


def _none_can_return(view: JobView, absent: Sequence[_Absence]) -> bool:
    """Whether no absent rank can come back: all are this node's FAILED ranks and the budget
    cannot relaunch them all (the policy relaunches all or none); waiting
    ``--node_time_out`` would then only delay the end."""
    states = {r.rank: r.state for r in view.ranks}
    return (all(a.failure is not None and states[a.rank] is WorkerState.FAILED for a in absent)
            and view.charged + len(absent) > view.max_restarts)


def absence_deadlines(view: JobView, absent: Sequence[_Absence]) -> list[float]:
    """When :func:`absences` acts next: each absent rank's retirement while enough train,
    else the end of the job's wait with too few."""
    if _training(view, absent) >= view.min_worker_num:
        return [a.since + view.rejoin_timeout for a in absent]
    return [_too_few_since(view, absent) + view.node_time_out]


def _too_few_since(view: JobView, absent: Sequence[_Absence]) -> float:
    """When the job fell below ``--min_worker_num`` training ranks."""
    deaths = sorted(a.since for a in absent)
    spare = _training(view, absent) + len(absent) - view.min_worker_num
    return deaths[min(max(spare, 0), len(deaths) - 1)]
