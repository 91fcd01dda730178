"""What the supervisor knows about the world outside its own children, for the policy; it
reads and never waits (the scheduler watch's latest snapshot, what the other nodes said, and
this node's events file, where the scheduler writes each registration before answering it)."""

from __future__ import annotations

from pathlib import Path

from launcher.config import LaunchConfig
from launcher.nodes.link import NodeWatch
from launcher.nodes.presence import BeatTracker
from launcher.supervisor.job_view import RETIRED_VERDICT, RankView
from launcher.supervisor.state import Failure, Worker, WorkerState
from launcher.supervisor.watch import SchedulerWatch, Scope, Snapshot
from launcher.view.progress import STEP_REPORTS, EventTail
from recovery.control.members import LIVE_STATES, MemberState, Verdict
from recovery.control.node_range import NODE_SILENT

__all__ = ["Observer", "watch_scope"]

WORKER_CALL_EVENT = "function_call"
"""A ``@recovery.restartable`` worker's call in a generation, at a step tftrun does not
know: taken as step 0 (it joined a generation)."""
_VERDICTS = {MemberState.LOST.value: Verdict.HEARTBEAT.value,
             MemberState.HUNG.value: Verdict.PROGRESS.value}


def watch_scope(config: LaunchConfig) -> Scope:
    """What of the scheduler's status the observer reads: the rows of this node's ranks,
    and the missing ranks on node 0 of several (which node is gone, which ranks lost);
    of the other nodes, every node reads counts only."""
    return Scope(range(config.first_rank, config.first_rank + config.nproc),
                 missing=config.multi_node and config.hosts_scheduler
                 and config.node_range is None)


class Observer:
    """What came in since the last pass: call :meth:`read` first on each pass."""

    def __init__(self, config: LaunchConfig, watch: SchedulerWatch,
                 events_path: Path | None, beats: BeatTracker | None = None) -> None:
        self._config = config
        self._watch = watch
        self._beats = beats
        """When each other node's tftrun last beat (node 0 of several)."""
        self._own = watch_scope(config).own
        self._tail = EventTail(events_path) if events_path is not None else None
        self.sees_registrations = config.hosts_scheduler and self._tail is not None
        """This node's scheduler writes every registration in the events file before it
        answers it: who registered is known without asking the scheduler, which may still
        be starting."""
        self._steps: dict[tuple[int, int], int] = {}
        """(rank, pid) → the last step that process reported."""
        self.node_watch = NodeWatch()
        """What of the other nodes is missing, and since when."""
        self.registered: set[str] = set()
        """Node ids seen registered with the scheduler: capable of per-rank recovery."""
        self._whole: set[int] = set()
        """Ranks whose process called a ``@recovery.restartable`` function: they train in
        whole generations only, so their peers wait for them, and no cooldown delays them."""
        self.snapshot: Snapshot | None = None
        self.lost: dict[int, float] = {}
        """Node 0, degraded training: the lost ranks of other nodes, and since when (see
        :attr:`~launcher.supervisor.job_view.JobView.lost_ranks`)."""

    def read(self, now: float, workers: list[Worker]) -> None:
        """Take the new events of this node and the latest snapshot. Call it before the
        exits are reaped: a worker's own step event read now was written by the process
        the worker runs now."""
        pids = {w.rank: w.pid for w in workers}
        for event in self._tail.read() if self._tail is not None else []:
            name, rank, step = event.get("event"), event.get("rank"), event.get("step")
            if name == "register" and "node_id" in event and self.sees_registrations:
                self.registered.add(str(event["node_id"]))
            elif name == "leave" and step is not None:
                self._note_step(int(event["rank"]), int(event["pid"]), int(step))
            elif name in STEP_REPORTS and step is not None \
                    and (pid := pids.get(rank)) is not None:
                self._note_step(int(rank), pid, int(step))
            elif name == WORKER_CALL_EVENT and event.get("pid") == pids.get(rank):
                self._note_step(int(rank), int(event["pid"]), 0)
                self._whole.add(int(rank))
        self.snapshot = self._watch.snapshot
        if self.snapshot is not None:
            for member in self.snapshot.members:
                self.registered.add(member.node_id)
                if member.global_step is not None:
                    self._note_step(member.rank, member.pid, member.global_step)
        self.lost = self._lost(now)
        self.node_watch.seen(self._missing(now), now)

    def _note_step(self, rank: int, pid: int, step: int) -> None:
        self._steps[rank, pid] = max(step, self._steps.get((rank, pid), step))

    # ----------------------------------------------------------------- the ranks
    def step(self, rank: int, pid: int | None) -> int | None:
        """The last step process ``pid`` of ``rank`` reported; None: none seen."""
        return None if pid is None else self._steps.get((rank, pid))

    def rank_view(self, worker: Worker, undecided: bool,
                  relaunched_after: Failure | None) -> RankView:
        """``worker`` as the policy sees it; ``undecided``: no group restart or end is under
        way; ``relaunched_after``: the failure it was last relaunched alone after."""
        running = worker.state is WorkerState.RUNNING
        registered = self.registered_or_unknown(worker)
        current = self.step(worker.rank, worker.pid)
        if not running or current is not None:
            relaunched_after = None  # it joined a generation: it waits for no gone peer
        crash = relaunched_after if running else worker.failure
        failed = worker.state is WorkerState.FAILED and undecided
        finished = worker.state is WorkerState.SUCCEEDED and worker.last_exit is not None
        return RankView(worker.rank, worker.state, worker.deadline, worker.failure, registered,
                        self.cooldown_until(worker) if failed and registered else 0.0,
                        worker.hung, worker.relaunch_why, current,
                        None if crash is None else self.step(worker.rank, crash.pid),
                        relaunched_after,
                        worker.last_exit.at if finished and worker.last_exit else None,
                        # asked only of a rank relaunched alone: O(members) each
                        holds_rank=relaunched_after is not None and self.holds_rank(worker))

    def holds_rank(self, worker: Worker) -> bool:
        """Whether the latest snapshot holds ``worker``'s process as its rank's live member."""
        return self.snapshot is not None and any(
            m.rank == worker.rank and m.pid == worker.pid and m.state in LIVE_STATES
            for m in self.snapshot.members)

    def registered_or_unknown(self, worker: Worker) -> bool | None:
        """Whether ``worker``'s node id registered; None while it cannot be known yet: a
        rank that failed before any snapshot taken since, on a node without the events
        file that has every registration (the policy waits up to ``STATUS_WAIT``)."""
        if str(worker.rank) in self.registered:
            return True
        failure = worker.failure
        if (self.sees_registrations or failure is None
                or (self.snapshot is not None and self.snapshot.taken_at >= failure.at)):
            return False
        return None

    def cooldown_until(self, worker: Worker) -> float:
        """When the scheduler lets ``worker``'s node id register again: ``rejoin_cooldown``
        after its failure (the supervisor reports it at once; at once for a rank that trains
        in whole generations only), or later when a snapshot taken after the report says so."""
        failure = worker.failure
        if failure is None:
            return 0.0
        until = failure.at + (0.0 if worker.rank in self._whole else self._config.rejoin_cooldown)
        if self.snapshot is not None and self.snapshot.taken_at >= failure.at:
            for member in self.snapshot.members:
                if member.node_id == str(worker.rank):
                    until = max(until, self.snapshot.taken_at + member.cooldown_left)
        return until

    def verdicts(self, workers: list[Worker]) -> dict[int, str]:
        """The ranks the scheduler declares dead or hung: rank → verdict, only where it holds
        the pid running now (not one of an earlier tftrun of this node)."""
        snapshot = self.snapshot
        if snapshot is None:
            return {}
        pids = {w.rank: w.pid for w in workers}
        return {m.rank: RETIRED_VERDICT if m.rank in snapshot.retired else _VERDICTS[m.state]
                for m in snapshot.members if m.state in _VERDICTS and pids.get(m.rank) == m.pid}

    # ----------------------------------------------------------------- the other nodes
    def _missing(self, now: float) -> str:
        """What of the other nodes is missing just now ('' when nothing is); on node 0, only
        ranks of nodes whose tftrun stopped beating, since a plain script's ranks never register."""
        config = self._config
        if not config.multi_node:
            return ""
        if not config.hosts_scheduler:
            return "" if self._watch.nodes.reachable else "node 0's scheduler"
        if self.snapshot is None or config.node_range is not None:
            return ""
        # the only node whose scope asks for them (watch_scope)
        missing = [r for r in self.snapshot.missing if r not in self._own]
        if self._beats is not None:
            self._beats.want({r // config.nproc for r in missing})
            missing = [r for r in missing if not self._beating(r // config.nproc, now)
                       and r not in self.lost]  # the policy's absence rules judge those
        return f"the ranks {missing} of another node" if missing else ""

    def _lost(self, now: float) -> dict[int, float]:
        """Node 0 of a degraded job: the lost ranks of other nodes, each with when its node
        last beat (see :attr:`~launcher.supervisor.job_view.JobView.lost_ranks`)."""
        snapshot, beats, config = self.snapshot, self._beats, self._config
        if snapshot is None or beats is None or not config.trains_degraded \
                or config.node_range is not None:
            return {}
        return {r: beats.silent_since(r // config.nproc) for r in snapshot.missing
                if r not in self._own and r in snapshot.missing_known and beats.heard(r // config.nproc)
                and not self._beating(r // config.nproc, now)}

    def others_training(self) -> tuple[int | None, frozenset[int]]:
        """How many ranks of the other nodes train (the scheduler holds a live or finished
        process for them, and they are not retired), and which were retired; (None, none)
        before the first snapshot."""
        if self.snapshot is None:
            return None, frozenset()
        retired = frozenset(r for r in self.snapshot.retired if r not in self._own)
        return self.snapshot.others.training, retired

    def _beating(self, node: int, now: float) -> bool:
        beats = self._beats
        assert beats is not None
        return beats.heard(node) and now - beats.silent_since(node) < NODE_SILENT

    def others_finished(self) -> tuple[bool, int | None]:
        """Whether every rank of the other nodes finished, and the highest step they
        reported (always True, None on one node)."""
        others = self._config.worker_num - self._config.nproc
        if not others:
            return True, None
        if self.snapshot is None:
            return False, None
        counts = self.snapshot.others
        return counts.finished == others, counts.finished_step
