"""The restart policy: a pure function from what the supervisor sees to what it does next.

``decide(view, now)`` (``now`` monotonic) runs on every pass of the loop, so that a rule holds at
every moment, not only when a failure is seen. It reads no clock, starts nothing and never
waits: waiting is an action (:class:`WaitUntil`), every waiting state has a deadline in the
view. The rules: docs/recovery.md (*The restart policy*), docs/elastic.md.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from launcher.config import RestartPolicy
from launcher.nodes.job_end import DONE_GRACE
from launcher.nodes.rounds import ROUND_POLL
from launcher.supervisor.absences import absence_deadlines, absences, absent_ranks
from launcher.supervisor.actions import (
    EXIT_PEER_ENDED,
    Action,
    Close,
    GiveUp,
    Hang,
    Kill,
    Relaunch,
    RelaunchScheduler,
    ReportExit,
    RestartAll,
    Retire,
    ScheduleRelaunch,
    SchedulerSpent,
    StartAll,
    Stop,
    StopWorkers,
    TeardownCrash,
    WaitUntil,
)
from launcher.supervisor.failures import ExitInfo
from launcher.supervisor.job_view import RETIRED_VERDICT, JobView, RankView, crash, degraded, short_stop, stop_all
from launcher.supervisor.state import WorkerState
from recovery.control.node_range import JobDone, TooFew
from recovery.exit_codes import UNFIXABLE

__all__ = ["decide", "exit_reports", "STATUS_WAIT", "PEERS_SETTLE"]

STATUS_WAIT = 10.0
"""Seconds a failed rank's registration may stay unknown (the scheduler process runs but
does not answer, e.g. on a loaded host) before it is taken as "not registered"."""
PEERS_SETTLE = 5.0
"""Seconds after a rank finished during which a rank that died is not yet restarted with
the group: its other peers, ending too, may still finish (their exits come seconds apart
at a job's end), and once all did the job ends instead (a teardown's crash)."""
_NO_STEP = -1


def decide(view: JobView, now: float) -> list[Action]:
    """What the supervisor does next (the rules: docs/recovery.md)."""
    return [*_about_the_scheduler(view), *exit_reports(view.exits, view.unknown_to_scheduler),
            *_about_workers(view, now)]


def exit_reports(exits: Sequence[ExitInfo], unknown: frozenset[int]) -> list[ReportExit]:
    """The exits the scheduler's membership hears of: every fault, and the ordinary ends
    of the ranks it knows."""
    return [ReportExit(e) for e in exits
            if not (e.expected or e.succeeded) or e.rank not in unknown]


def _about_the_scheduler(view: JobView) -> list[Action]:
    if not view.scheduler_exit:
        return []
    why = f"scheduler {view.scheduler_exit}"
    if view.scheduler_launches > view.max_restarts:
        return [SchedulerSpent(why)]
    return [RelaunchScheduler(why)]


def _about_workers(view: JobView, now: float) -> list[Action]:
    if view.ending is not None:
        return _wind_down(view, now)
    if isinstance(view.round_outcome, TooFew):
        return [Stop(EXIT_PEER_ENDED, view.round_outcome.reason, everywhere=view.node_rank == 0)]
    if isinstance(view.round_outcome, JobDone):
        return [Stop(0, view.round_outcome.reason)]
    if view.signal is not None:
        name = signal.Signals(view.signal).name
        return [Stop(128 + view.signal, f"received {name}"),
                stop_all(view, now, view.signal)]
    if view.peer_end:
        return [Stop(EXIT_PEER_ENDED, view.peer_end), stop_all(view, now)]
    if view.missing_since is not None and now - view.missing_since >= view.node_time_out:
        reason = (f"node {view.node_rank}: {view.missing} did not come back within "
                  f"--node_time_out={view.node_time_out:g}s")
        return [Stop(EXIT_PEER_ENDED, reason, everywhere=True), stop_all(view, now)]
    if view.round_forming:  # nothing of this node runs until the round formed
        return [WaitUntil(now + ROUND_POLL)]
    if all(r.state is WorkerState.SUCCEEDED for r in view.ranks if not r.retired):
        retired = sorted([r.rank for r in view.ranks if r.retired] + [*view.others_retired])
        return [_ended_well(view, "all workers succeeded" + (f"; ranks {retired} were retired"
                                                               if retired else ""))]
    if view.peer_done and (now >= view.peer_done_at + DONE_GRACE
                           or not any(r.state is WorkerState.RUNNING for r in view.ranks)):
        return [Stop(0, view.peer_done), stop_all(view, now)]
    if view.peer_restart and view.restart_at is None:
        # The whole group restarts together; the node that started it charged it.
        return [RestartAll(now, view.peer_restart), _stop_for_restart(view, now)]
    failed = [r for r in view.ranks
              if r.state is WorkerState.FAILED and view.restart_at is None and not r.retired]
    if unfixable := _unfixable(failed):
        return [unfixable, stop_all(view, now)]
    if (ending := _peers_finished(view, now)) is not None:
        return ending
    if (change := _membership_change(view, now)) is not None:
        return change
    if (absence := absences(view, now)) is not None:
        return absence
    actions: list[Action] = [_on_verdict(view, r.rank, now) for r in view.ranks
                             if r.state is WorkerState.RUNNING and not r.hung
                             and r.rank in view.verdicts]
    actions += _overdue(view, now)
    if failed:
        if (until := _registrations_pending(view, failed, now)) is not None:
            return [*actions, WaitUntil(until)]
        decided = _on_failures(view, failed, now)
    else:
        decided = _withdrawn_relaunches(view, now)
    if any(isinstance(a, (RestartAll, GiveUp)) for a in decided):
        return decided
    actions += decided
    if not _finished(view):
        actions += [Relaunch(r.rank) for r in view.ranks
                    if r.state is WorkerState.COOLDOWN and r.deadline <= now]
    if (view.restart_at is not None and view.restart_at <= now
            and not any(r.state is WorkerState.STOPPING for r in view.ranks)):
        actions.append(StartAll(frozenset(r.rank for r in view.ranks if r.retired)))
    actions.append(WaitUntil(_next_deadline(view, decided, now)))
    return actions


def _membership_change(view: JobView, now: float) -> list[Action] | None:
    """Node 0 of an elastic job: restart the group for a node lost or one that asked to
    join, or end the job below ``MIN`` (docs/multi-node.md)."""
    span = view.node_range
    if span is None or not view.round_nodes or view.restart_at is not None:
        return None
    lost = [node for node in view.round_nodes if node in view.silent_since
            and now - view.silent_since[node] >= view.node_time_out]
    if lost:
        left = len(view.round_nodes) - len(lost)
        why = (f"nodes {lost} sent no beat for --node_time_out={view.node_time_out:g}s, "
               f"{left} left")
        if left < span.low:
            return [Stop(EXIT_PEER_ENDED, f"node {view.node_rank}: {why}, fewer than "
                                          f"--nnodes={span.low}:{span.high} needs", everywhere=True),
                    stop_all(view, now)]
        return [RestartAll(now, why, charged=False), _stop_for_restart(view, now)]
    joining = sorted(view.waiting_nodes - set(view.round_nodes))
    if joining and len(view.round_nodes) < span.high:
        return [RestartAll(now, f"nodes {joining} asked to join", charged=False),
                _stop_for_restart(view, now)]
    return None


def _wind_down(view: JobView, now: float) -> list[Action]:
    """Stopping: SIGKILL what outlived its grace period; close once no worker runs."""
    if not any(r.state is WorkerState.STOPPING for r in view.ranks):
        return [Close()]
    return [*_overdue(view, now), WaitUntil(_next_deadline(view, [], now))]


def _overdue(view: JobView, now: float) -> list[Action]:
    return [Kill(r.rank) for r in view.ranks
            if r.state is WorkerState.STOPPING and r.deadline <= now]


def _stop_for_restart(view: JobView, now: float) -> StopWorkers:
    """A group restart: the whole grace period for a registered rank (it may be saving
    last words), :data:`RESTART_GRACE` for the others."""
    return StopWorkers(signal.SIGTERM, {
        r.rank: now + view.grace_period if r.registered else short_stop(view, now)
        for r in view.ranks if r.state is WorkerState.RUNNING})


def _unfixable(failed: Sequence[RankView]) -> GiveUp | None:
    for rank in failed:
        assert rank.failure is not None
        why = UNFIXABLE.get(rank.failure.returncode or 0)
        if why is not None:
            return GiveUp(rank.failure, f"rank {rank.rank} {rank.failure.reason}: {why}; "
                                        f"no restart can fix it")
    return None


def _on_verdict(view: JobView, rank: int, now: float) -> Action:
    """Kill a rank the scheduler judged dead or hung; stop one it retired as well, for good."""
    verdict = view.verdicts[rank]
    if verdict == RETIRED_VERDICT:
        return Retire(rank, f"the scheduler retired rank {rank} as it judged it lost",
                      short_stop(view, now))
    return Hang(rank, verdict)


def _per_rank(view: JobView, failed: Sequence[RankView]) -> bool:
    """Whether the failed ranks would be relaunched alone (while no rank finished)."""
    return view.restart_policy is RestartPolicy.RANK or (
        view.restart_policy is RestartPolicy.AUTO and all(r.registered for r in failed))


def _peers_finished(view: JobView, now: float) -> list[Action] | None:
    """The ending job: every other rank exited 0 and each rank left was relaunched alone
    (or is about to be) after a crash. It could only wait ``--cluster_time_out`` for a
    generation that cannot form: stop it and end the job; status 0, with a warning, when
    each crash came after the peers' final step (a teardown's crash), else the crash's."""
    left = [r for r in view.ranks if r.state is not WorkerState.SUCCEEDED and not r.retired]
    peers = len(_finished(view)) + view.other_ranks - len(view.others_retired)
    if (not left or not peers or not view.others_finished or view.restart_at is not None
            or not all(_stranded(view, r) for r in left)):
        return None
    steps = [r.step for r in view.ranks if r.state is WorkerState.SUCCEEDED]
    final = max((s for s in [*steps, view.others_step] if s is not None), default=None)
    stop = StopWorkers(signal.SIGTERM, {r.rank: short_stop(view, now)
                                        for r in left if r.state is WorkerState.RUNNING})
    short = [r for r in left if final is None
             or (r.failure_step if r.failure_step is not None else _NO_STEP) < final]
    size = len(view.ranks) + view.other_ranks
    if short and view.min_worker_num <= peers < size:
        # Degraded training: the peers trained the lost ranks' samples too, to the end.
        what = ", ".join(f"rank {r.rank} ({crash(r).reason})" for r in left)
        return [_ended_well(view, f"all workers finished; the survivors trained on without {what}"),
                stop]
    if short:  # every one when the peers' final step is not known
        first = short[0]
        at = "no step" if first.failure_step is None else f"step {first.failure_step}"
        return [GiveUp(crash(first), f"rank {first.rank} {crash(first).reason} at {at}, "
                                      f"before its peers' final step {final}, and they "
                                      f"finished: a relaunched rank could not rejoin them"),
                stop]
    crashes = [TeardownCrash(r.rank, crash(r), r.failure_step or 0, final) for r in left]
    what = "; ".join(f"rank {c.rank} {c.failure.reason} in its teardown, after the final "
                     f"step {final}" for c in crashes)
    return [*crashes, _ended_well(view, f"all workers finished ({what})"), stop]


def _ended_well(view: JobView, reason: str) -> Stop:
    """Status 0; node 0 of an elastic job also closes the rounds (no generation comes)."""
    return Stop(0, reason, close_rounds=bool(view.round_nodes))


def _stranded(view: JobView, rank: RankView) -> bool:
    """Relaunched alone (waiting in COOLDOWN, or running with no step yet), or FAILED and
    about to be."""
    return (rank.state is WorkerState.COOLDOWN
            or (rank.state is WorkerState.RUNNING and rank.relaunched_after is not None)
            or (rank.state is WorkerState.FAILED and rank.registered is not None
                and _per_rank(view, [rank])))


def _registrations_pending(view: JobView, failed: Sequence[RankView],
                           now: float) -> float | None:
    """Under ``auto``, the time to wait until for a failed rank's unknown registration."""
    if view.restart_policy is not RestartPolicy.AUTO:
        return None
    until = [r.failure.at + STATUS_WAIT for r in failed
             if r.registered is None and r.failure is not None]
    return max(until) if until and max(until) > now else None


def _on_failures(view: JobView, failed: Sequence[RankView], now: float) -> list[Action]:
    """Relaunch the failed ranks alone (their relaunch waits in COOLDOWN: for the
    cooldown, and :data:`PEERS_SETTLE` after the last rank that finished), restart all, or
    give up."""
    why = "; ".join(f"rank {r.rank} {crash(r).reason}" for r in failed)
    if _per_rank(view, failed):
        if view.charged + len(failed) > view.max_restarts:
            if degraded(view):
                return []  # not relaunched: absent until retired, or the job ends (launcher/supervisor/absences.py)
            return [_give_up(view, failed[0], why), stop_all(view, now)]
        return [ScheduleRelaunch(r.rank, max(now, r.cooldown_until, _settled(view)),
                                 f"rank {r.rank} {crash(r).reason}") for r in failed]
    cooldowns = [r.cooldown_until for r in failed if r.registered]
    return _restart_all(view, failed[0], why,
                        max([now, *cooldowns, *_relaunch_times(view)]), now)


def _withdrawn_relaunches(view: JobView, now: float) -> list[Action]:
    """A relaunch due while another rank finished (and others still run) could only wait
    for peers that are gone: the group restarts instead."""
    cooling = [r for r in view.ranks if r.state is WorkerState.COOLDOWN]
    finished = _finished(view)
    if not cooling or not finished or max([*_relaunch_times(view), _settled(view)]) > now:
        return []
    why = "; ".join(r.relaunch_why for r in cooling)
    why += f" after ranks {finished} finished: a relaunched rank could not rejoin them"
    return _restart_all(view, cooling[0], why, now, now)


def _finished(view: JobView) -> list[int]:
    return [r.rank for r in view.ranks if r.state is WorkerState.SUCCEEDED]


def _settled(view: JobView) -> float:
    """:data:`PEERS_SETTLE` after the last rank that finished (0.0: none did)."""
    return max((r.finished_at + PEERS_SETTLE for r in view.ranks
                if r.state is WorkerState.SUCCEEDED and r.finished_at is not None),
               default=0.0)


def _restart_all(view: JobView, first: RankView, why: str, at: float,
                 now: float) -> list[Action]:
    if view.restarts + view.relaunches + 1 > view.max_restarts:
        return [_give_up(view, first, why), stop_all(view, now)]
    return [RestartAll(at, why), _stop_for_restart(view, now)]


def _give_up(view: JobView, first: RankView, why: str) -> GiveUp:
    return GiveUp(crash(first), f"{why}; restart budget ({view.max_restarts}) spent")


def _relaunch_times(view: JobView) -> list[float]:
    return [r.deadline for r in view.ranks if r.state is WorkerState.COOLDOWN]


def _next_deadline(view: JobView, decided: Sequence[Action], now: float) -> float:
    """The earliest time something is due, after ``now``; overdue kills are repeated at
    each pass."""
    due = [r.deadline for r in view.ranks
           if r.state in (WorkerState.COOLDOWN, WorkerState.STOPPING) and r.deadline > now]
    due += [a.at for a in decided if isinstance(a, ScheduleRelaunch)]
    if view.restart_at is not None:
        due.append(view.restart_at)
    if view.missing_since is not None:
        due.append(view.missing_since + view.node_time_out)
    due += [at for node in view.round_nodes if node in view.silent_since
            and (at := view.silent_since[node] + view.node_time_out) > now]
    if _finished(view) and _relaunch_times(view) and _settled(view) > now:
        due.append(_settled(view))
    if degraded(view) and (absent := absent_ranks(view)):
        due += [at for at in absence_deadlines(view, absent) if at > now]
    return min(due, default=float("inf"))
