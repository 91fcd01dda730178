"""The restart policy: a pure function from what the supervisor sees to what it does next.

``decide(view, now)`` is called on every pass of the supervisor's loop with a snapshot of
the job (:class:`JobView`) and returns the :class:`Action` list the loop carries out. It
reads no clock, starts nothing and never waits: waiting is an action (:class:`WaitUntil`)
and every waiting state (a relaunch's cooldown, a group restart, a stop's grace period)
is a state with a deadline in the view. Being re-evaluated on every pass is what keeps a
rule such as "no rank is relaunched alone once another rank finished" true at every
moment, not only when a failure is seen.

The rules (docs/recovery.md, *The restart policy*):

* a worker exit in :data:`recovery.exit_codes.UNFIXABLE` ends the job at once;
* the budget (``--max_restarts``) is charged when a relaunch or a group restart is
  decided; a relaunch withdrawn into a group restart gives its charge to that restart;
* per-rank relaunch (``--restart_policy=rank``, or ``auto`` when every dead rank
  registered with the scheduler) while no rank finished; else restart all;
* a relaunch waiting in COOLDOWN when another rank finishes becomes a group restart.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launcher.supervisor.state import Failure, WorkerState
from recovery.exit_codes import UNFIXABLE

__all__ = [
    "RankView", "JobView", "Ending", "Action", "Hang", "ScheduleRelaunch", "Relaunch",
    "RestartAll", "StartAll", "Stop", "GiveUp", "Kill", "Close", "WaitUntil", "decide",
    "STATUS_WAIT", "EXIT_PEER_ENDED",
]

EXIT_PEER_ENDED = 1
"""tftrun's status when another node ended the job (its own reason says why)."""
STATUS_WAIT = 10.0
"""Seconds a failed rank's registration may stay unknown (the scheduler process runs but
does not answer, e.g. on a loaded host) before it is taken as "not registered"."""


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
    restart_policy: str = "auto"
    restarts: int = 0
    """Group restarts carried out."""
    relaunches: int = 0
    """Single-rank relaunches carried out."""
    restart_at: float | None = None
    """A group restart is decided and due at this time."""
    ending: Ending | None = None
    signal: int | None = None
    """A SIGINT/SIGTERM that tftrun received."""
    verdicts: Mapping[int, str] = field(default_factory=dict)
    """Ranks the scheduler declares dead or hung just now: rank → reason."""
    peer_restart: str = ""
    """Another node started a group restart this node has not: why (empty: none)."""
    peer_end: str = ""
    """Another node ended the job for every node: why (empty: it did not)."""

    @property
    def charged(self) -> int:
        """Restarts charged to the budget: carried out, and decided but pending."""
        pending = (1 if self.restart_at is not None
                   else sum(r.state is WorkerState.COOLDOWN for r in self.ranks))
        return self.restarts + self.relaunches + pending


@dataclass(frozen=True)
class Hang:
    """SIGKILL a running rank the scheduler declared dead or hung (event ``hang``)."""

    rank: int
    reason: str


@dataclass(frozen=True)
class ScheduleRelaunch:
    """Relaunch a FAILED rank alone at ``at`` (charged now): it waits in COOLDOWN."""

    rank: int
    at: float
    why: str


@dataclass(frozen=True)
class Relaunch:
    """A rank's COOLDOWN is over: start it again."""

    rank: int


@dataclass(frozen=True)
class RestartAll:
    """Restart the whole group at ``at`` (charged now): stop every running worker and
    withdraw every pending relaunch."""

    at: float
    why: str


@dataclass(frozen=True)
class StartAll:
    """The group restart is due and every worker is stopped: start them all."""


@dataclass(frozen=True)
class Stop:
    """End the job (every worker succeeded, or tftrun was signalled)."""

    status: int
    reason: str


@dataclass(frozen=True)
class GiveUp:
    """End the job on ``failure``: the budget is spent, or no restart can fix it."""

    failure: Failure
    reason: str


@dataclass(frozen=True)
class Kill:
    """A STOPPING rank's grace period is over: SIGKILL it."""

    rank: int


@dataclass(frozen=True)
class Close:
    """The job ends and no worker runs any more: stop the spares and the scheduler."""


@dataclass(frozen=True)
class WaitUntil:
    """Nothing is due before ``at`` (the loop wakes earlier for any child's exit)."""

    at: float


Action = (Hang | ScheduleRelaunch | Relaunch | RestartAll | StartAll | Stop | GiveUp | Kill
          | Close | WaitUntil)


def decide(view: JobView, now: float) -> list[Action]:
    """What the supervisor does next; see the module docstring for the rules."""
    if view.ending is not None:
        return _wind_down(view, now)
    if view.signal is not None:
        return [Stop(128 + view.signal, f"received {signal.Signals(view.signal).name}")]
    if view.peer_end:
        return [Stop(EXIT_PEER_ENDED, view.peer_end)]
    if all(r.state is WorkerState.SUCCEEDED for r in view.ranks):
        return [Stop(0, "all workers succeeded")]
    if view.peer_restart and view.restart_at is None:
        # The whole group restarts together; the node that started it charged it.
        return [RestartAll(now, view.peer_restart)]
    failed = [r for r in view.ranks
              if r.state is WorkerState.FAILED and view.restart_at is None]
    if unfixable := _unfixable(failed):
        return [unfixable]
    actions: list[Action] = [Hang(r.rank, view.verdicts[r.rank]) for r in view.ranks
                             if r.state is WorkerState.RUNNING and not r.hung
                             and r.rank in view.verdicts]
    actions += _overdue(view, now)
    if failed:
        if (until := _registrations_pending(view, failed, now)) is not None:
            return [*actions, WaitUntil(until)]
        decided = _on_failures(view, failed, now)
    else:
        decided = _withdrawn_relaunches(view)
    if any(isinstance(a, (RestartAll, GiveUp)) for a in decided):
        return decided
    actions += decided
    actions += [Relaunch(r.rank) for r in view.ranks
                if r.state is WorkerState.COOLDOWN and r.deadline <= now]
    if (view.restart_at is not None and view.restart_at <= now
            and not any(r.state is WorkerState.STOPPING for r in view.ranks)):
        actions.append(StartAll())
    actions.append(WaitUntil(_next_deadline(view, decided, now)))
    return actions


def _wind_down(view: JobView, now: float) -> list[Action]:
    """Stopping: SIGKILL what outlived its grace period; close once no worker runs."""
    stopping = [r for r in view.ranks if r.state is WorkerState.STOPPING]
    if not stopping:
        return [Close()]
    return [*_overdue(view, now), WaitUntil(_next_deadline(view, [], now))]


def _overdue(view: JobView, now: float) -> list[Action]:
    return [Kill(r.rank) for r in view.ranks
            if r.state is WorkerState.STOPPING and r.deadline <= now]


def _unfixable(failed: Sequence[RankView]) -> GiveUp | None:
    for rank in failed:
        assert rank.failure is not None
        why = UNFIXABLE.get(rank.failure.returncode or 0)
        if why is not None:
            return GiveUp(rank.failure, f"rank {rank.rank} {rank.failure.reason}: {why}; "
                                        f"no restart can fix it")
    return None


def _registrations_pending(view: JobView, failed: Sequence[RankView],
                           now: float) -> float | None:
    """Under ``auto``, the time to wait until for a failed rank's unknown registration."""
    if view.restart_policy != "auto":
        return None
    until = [r.failure.at + STATUS_WAIT for r in failed
             if r.registered is None and r.failure is not None]
    return max(until) if until and max(until) > now else None


def _on_failures(view: JobView, failed: Sequence[RankView], now: float) -> list[Action]:
    """Relaunch the failed ranks alone, restart all, or give up."""
    per_rank = view.restart_policy == "rank" or (
        view.restart_policy == "auto" and all(r.registered for r in failed))
    finished = [r.rank for r in view.ranks if r.state is WorkerState.SUCCEEDED]
    why = "; ".join(f"rank {r.rank} {_failure(r).reason}" for r in failed)
    if per_rank and not finished:
        if view.charged + len(failed) > view.max_restarts:
            return [_give_up(view, failed[0], why)]
        return [ScheduleRelaunch(r.rank, max(now, r.cooldown_until),
                                 f"rank {r.rank} {_failure(r).reason}") for r in failed]
    if per_rank:
        why += f" after ranks {finished} finished: a relaunched rank could not rejoin them"
    cooldowns = [r.cooldown_until for r in failed if r.registered]
    return [_restart_all(view, failed[0], why, max([now, *cooldowns, *_relaunch_times(view)]))]


def _withdrawn_relaunches(view: JobView) -> list[Action]:
    """A rank waiting for its relaunch while another finished could only wait for peers
    that are gone: the group restarts instead, when the relaunch was due."""
    cooling = [r for r in view.ranks if r.state is WorkerState.COOLDOWN]
    finished = [r.rank for r in view.ranks if r.state is WorkerState.SUCCEEDED]
    if not cooling or not finished:
        return []
    why = "; ".join(r.relaunch_why for r in cooling)
    why += f" after ranks {finished} finished: a relaunched rank could not rejoin them"
    return [_restart_all(view, cooling[0], why, max(_relaunch_times(view)))]


def _restart_all(view: JobView, first: RankView, why: str, at: float) -> Action:
    if view.restarts + view.relaunches + 1 > view.max_restarts:
        return _give_up(view, first, why)
    return RestartAll(at, why)


def _give_up(view: JobView, first: RankView, why: str) -> GiveUp:
    return GiveUp(_failure(first), f"{why}; restart budget ({view.max_restarts}) spent")


def _failure(rank: RankView) -> Failure:
    assert rank.failure is not None, f"rank {rank.rank} is {rank.state.value} without a failure"
    return rank.failure


def _relaunch_times(view: JobView) -> list[float]:
    return [r.deadline for r in view.ranks if r.state is WorkerState.COOLDOWN]


def _next_deadline(view: JobView, decided: Sequence[Action], now: float) -> float:
    """The earliest time something is due; overdue kills are repeated at each pass."""
    due = [r.deadline for r in view.ranks
           if r.state is WorkerState.COOLDOWN
           or (r.state is WorkerState.STOPPING and r.deadline > now)]
    due += [a.at for a in decided if isinstance(a, ScheduleRelaunch)]
    if view.restart_at is not None:
        due.append(view.restart_at)
    return min(due, default=float("inf"))
