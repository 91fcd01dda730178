"""The restart policy (launcher/supervisor/policy.py) under random sequences of events, with Hypothesis.

A ``RuleBasedStateMachine`` plays the world around ``decide``: worker exits (0 is a
finish), signals to tftrun, the scheduler's verdicts, registrations and cooldowns, a
scheduler that does not answer or dies, the steps the workers report, launches that
cannot be started, other nodes (their group restarts, their end, their loss, their
ranks finishing), and the clock. Each ``supervise`` step runs the supervisor's passes: it builds the view, calls
``decide`` and carries the actions out on real :class:`launcher.supervisor.state.Worker` objects,
as launcher/supervisor/loop.py does, so a move the transition table forbids raises. After
every pass it checks the invariants of issue 15: no illegal transition, the budget never
exceeded, no rank relaunched alone into a generation that cannot form, every dead rank
relaunched or the job ending with a reason, the job ending once all ranks succeeded; and issue
27's: the scheduler relaunched within its budget only, a lost node ending the job at
``--node_time_out``, a rank stranded by peers that all finished stopped at once (status 0 with
``teardown_crash`` only when it had reached their final step), a group restart's short grace
for ranks that never registered; and degraded training's (``--min_worker_num``, issue 25): a
rank absent for ``--rejoin_timeout`` is retired while enough ranks train, never before, never
relaunched after (but by a group restart); with too few the job ends at ``--node_time_out``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from launcher.config import DEFAULT_SIGNALS, RestartPolicy
from launcher.nodes.rounds import ROUND_POLL
from launcher.supervisor.absences import absent_since
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
from launcher.supervisor.job_state import JobState
from launcher.supervisor.job_view import RESTART_GRACE, RETIRED_VERDICT, Ending, JobView, RankView
from launcher.supervisor.policy import PEERS_SETTLE, STATUS_WAIT, decide
from launcher.supervisor.state import Failure, Worker, WorkerState
from recovery.control.node_range import JobDone, NodeRange, TooFew
from recovery.exit_codes import UNFIXABLE

WORKERS = 3
GRACE = 10.0
NODE_TIME_OUT = 30.0
REJOIN_TIMEOUT = 12.0
PASSES = 40
"""Passes one ``supervise`` step may take before the policy has nothing left to do now
(each failed launch of a rank with no cooldown takes two)."""

ranks = st.integers(0, WORKERS - 1)
exit_codes = st.sampled_from([0, 0, 1, 3, -9, -15, *UNFIXABLE])


@dataclass
class _Process:
    """Stands in for launcher.procs.process.Child: the policy only sees that one runs."""

    pid: int


class PolicyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000.0
        self.workers = [Worker(rank=r, local_rank=r) for r in range(WORKERS)]
        self.max_restarts = 0
        self.policy = "auto"
        self.state = JobState()
        """The supervisor's own bookkeeping, moved by the actions as in the supervisor."""
        self.restarts = 0
        self.closed = False
        self.signal: int | None = None
        self.verdicts: dict[int, str] = {}
        self.registered: set[int] = set()
        self.scheduler_silent = False
        self.cooldowns: dict[int, float] = {}
        self.spawn_fails = False
        self.killed: set[int] = set()
        self.pids = 100
        self.peer_restarts = 0
        """The highest group restart another node started (they share one budget)."""
        self.peer_end = ""
        self.followed = 0
        """Group restarts this node made because another node started them."""
        self.scheduler_alive = True
        self.scheduler_exit = ""
        self.scheduler_launches = 1
        self.steps: dict[int, int] = {}
        """pid → the last step that process reported."""
        self.exits: list[ExitInfo] = []
        """The exits of this pass, for the view."""
        self.missing_since: float | None = None
        self.other_ranks = 0
        self.others_finished = False
        self.teardown_crashes: list[TeardownCrash] = []
        self.restart_stops: list[StopWorkers] = []
        self.min_worker_num = WORKERS
        self.holding: set[int] = set()
        """Pids the scheduler holds as their rank's live member (they registered)."""
        self.lost: dict[int, float] = {}
        """Node 0: the other node's ranks lost with their node, and since when."""
        self.node_range: NodeRange | None = None
        self.round_nodes: tuple[int, ...] = ()
        self.silent_since: dict[int, float] = {}
        self.waiting_nodes: set[int] = set()

    @property
    def restart_at(self) -> float | None:
        return self.state.restart_at

    @property
    def ending(self) -> Ending | None:
        return self.state.ending

    @property
    def relaunches(self) -> int:
        return self.state.relaunches

    @property
    def retired(self) -> set[int]:
        """Retired ranks: this node's, and the lost ones of the other node."""
        return self.state.retired | set(self.state.retiring)

    @property
    def absent_since(self) -> dict[int, float]:
        return self.state.absent_since

    # ------------------------------------------------------------ the world
    @initialize(max_restarts=st.integers(0, 4), policy=st.sampled_from(list(RestartPolicy)),
                registered=st.sets(ranks), other_ranks=st.sampled_from([0, 0, 3]),
                min_worker_num=st.sampled_from(["size", "size", 1, 2]),
                fewest_nodes=st.sampled_from([None, None, 1, 2]))
    def start(self, max_restarts: int, policy: RestartPolicy, registered: set[int],
              other_ranks: int, min_worker_num: int | str, fewest_nodes: int | None) -> None:
        self.max_restarts, self.policy, self.registered = max_restarts, policy, registered
        # "size": the job's size, no degraded training
        self.min_worker_num = WORKERS + other_ranks if min_worker_num == "size" else int(min_worker_num)
        self.other_ranks, self.others_finished = other_ranks, not other_ranks
        if fewest_nodes is not None and policy is not RestartPolicy.RANK:
            # Node 0 of --nnodes=fewest_nodes:3, in a generation with node 1: the size is
            # the rounds' (no degraded training).
            self.node_range, self.round_nodes = NodeRange(fewest_nodes, 3), (0, 1)
            self.other_ranks, self.others_finished, self.min_worker_num = WORKERS, False, 2 * WORKERS
        for worker in self.workers:
            self._launch(worker)

    @precondition(lambda self: not self.closed)
    @rule(rank=ranks, code=exit_codes)
    def process_exits(self, rank: int, code: int) -> None:
        self._exit(self.workers[rank], code)

    @precondition(lambda self: not self.closed)
    @rule(rank=ranks, reason=st.sampled_from(["heartbeat", "progress"]))
    def scheduler_declares_hung(self, rank: int, reason: str) -> None:
        self.verdicts[rank] = reason

    @precondition(lambda self: not self.closed)
    @rule(signum=st.sampled_from(DEFAULT_SIGNALS))
    def tftrun_is_signalled(self, signum: int) -> None:
        self.signal = self.signal or signum

    @precondition(lambda self: not self.closed)
    @rule(rank=ranks)
    def rank_registers(self, rank: int) -> None:
        self.registered.add(rank)

    @precondition(lambda self: not self.closed)
    @rule(rank=ranks)
    def process_registers(self, rank: int) -> None:
        """The rank's running process registers (a relaunched one is back)."""
        child = self.workers[rank].child
        if self.workers[rank].state is WorkerState.RUNNING and child is not None:
            self.holding.add(child.pid)

    @precondition(lambda self: not self.closed)
    @rule(silent=st.booleans())
    def scheduler_answers(self, silent: bool) -> None:
        self.scheduler_silent = silent

    @precondition(lambda self: not self.closed)
    @rule(rank=ranks, seconds=st.sampled_from([0.0, 3.0, 30.0]))
    def cooldown_runs(self, rank: int, seconds: float) -> None:
        self.cooldowns[rank] = self.now + seconds

    @precondition(lambda self: not self.closed)
    @rule(fails=st.booleans())
    def launches_fail(self, fails: bool) -> None:
        self.spawn_fails = fails

    @precondition(lambda self: not self.closed)
    @rule()
    def another_node_restarts_all(self) -> None:
        """Another node started the next group restart, within the shared budget."""
        if max(self.restarts, self.peer_restarts) + 1 <= self.max_restarts:
            self.peer_restarts = max(self.restarts, self.peer_restarts) + 1

    @precondition(lambda self: not self.closed)
    @rule()
    def another_node_ends_the_job(self) -> None:
        self.peer_end = "node 1: rank 3 exited with code 1; restart budget (0) spent"

    @precondition(lambda self: not self.closed)
    @rule(rank=ranks, step=st.integers(1, 6))
    def rank_reports_a_step(self, rank: int, step: int) -> None:
        worker = self.workers[rank]
        if worker.state is WorkerState.RUNNING and worker.child is not None:
            self.steps[worker.child.pid] = max(step, self.steps.get(worker.child.pid, step))

    @precondition(lambda self: not self.closed and self.scheduler_alive)
    @rule()
    def scheduler_dies(self) -> None:
        self.scheduler_alive, self.scheduler_exit = False, "exited with code 1"

    @precondition(lambda self: not self.closed and self.other_ranks > 0)
    @rule(missing=st.booleans())
    def another_node_is_seen(self, missing: bool) -> None:
        """Another node is missing (or back); the observer dates the unbroken absence."""
        self.missing_since = (self.missing_since or self.now) if missing else None

    @precondition(lambda self: not self.closed and self.other_ranks > 0)
    @rule()
    def the_other_nodes_ranks_finish(self) -> None:
        self.others_finished = True

    @precondition(lambda self: not self.closed and self.round_nodes)
    @rule(node=st.sampled_from([1, 2]), silent=st.booleans())
    def a_node_of_the_generation_is_heard(self, node: int, silent: bool) -> None:
        """A node of the generation stops beating (or beats again)."""
        if node in self.round_nodes and silent:
            self.silent_since.setdefault(node, self.now)
        else:
            self.silent_since.pop(node, None)

    @precondition(lambda self: not self.closed and self.round_nodes)
    @rule(node=st.sampled_from([1, 2]))
    def a_node_asks_to_join(self, node: int) -> None:
        self.waiting_nodes.add(node)

    @precondition(lambda self: not self.closed and self.other_ranks > 0
                  and self.node_range is None and not self.lost)
    @rule()
    def the_other_node_is_lost(self) -> None:
        """The other node's tftrun went silent with its ranks (node 0 judges them)."""
        self.lost = {rank: self.now for rank in range(WORKERS, WORKERS + self.other_ranks)}

    @precondition(lambda self: not self.closed and self.lost)
    @rule()
    def the_lost_node_comes_back(self) -> None:
        self.lost = {rank: since for rank, since in self.lost.items() if rank in self.retired}

    @rule(seconds=st.sampled_from([0.05, 1.0, 5.0, 11.0, 40.0]))
    def clock_advances(self, seconds: float) -> None:
        self.now += seconds

    # ------------------------------------------------------------ the supervisor
    @precondition(lambda self: not self.closed)
    @rule()
    def supervise(self) -> None:
        """The supervisor's passes until the policy has nothing more to do before the clock
        moves; then the invariants that hold between two events."""
        for _ in range(PASSES):
            for worker in self.workers:
                if worker.rank in self.killed:
                    self._exit(worker, -9)
            self.killed.clear()
            view = self._view()
            actions = decide(view, self.now)
            self._check_exit_reports(view, actions)
            self.verdicts.clear()
            self.exits.clear()
            self.scheduler_exit = ""
            for action in actions:
                self._carry_out(action)
                self._check_budget()
            self._check_the_scheduler(view, actions)
            if all(isinstance(a, (WaitUntil, Kill)) for a in actions) or self.closed:
                break
        else:
            pytest.fail(f"the policy still acts after {PASSES} passes at the same moment")
        self._check_no_relaunch_waits_for_peers_that_are_gone()
        self._check_every_dead_rank_is_relaunched_or_the_job_ends()
        self._check_the_job_ends_once_all_ranks_succeeded()
        self._check_the_other_nodes_are_followed()
        self._check_a_lost_node_ends_the_job()
        self._check_a_stranded_rank_ends_the_job()
        self._check_the_restart_grace()
        self._check_absent_ranks_are_retired_or_the_job_ends()
        self._check_the_node_range()

    def _view(self) -> JobView:
        undecided = self.restart_at is None and self.ending is None
        return JobView(
            tuple(self._rank_view(w, undecided) for w in self.workers), self.max_restarts,
            self.policy, self.restarts, self.relaunches, self.restart_at, self.ending,
            self.signal, dict(self.verdicts),
            f"another node started group restart {self.peer_restarts}"
            if self.peer_restarts > self.restarts else "", self.peer_end,
            grace_period=GRACE, missing="node 1" if self.missing_since is not None else "",
            missing_since=self.missing_since, node_time_out=NODE_TIME_OUT,
            other_ranks=self.other_ranks, others_finished=self.others_finished,
            others_step=5 if self.others_finished and self.other_ranks else None,
            scheduler_exit=self.scheduler_exit, scheduler_launches=self.scheduler_launches,
            min_worker_num=self.min_worker_num, rejoin_timeout=REJOIN_TIMEOUT,
            others_training=self.other_ranks - len(self.lost) if self.lost else None,
            others_retired=frozenset(self.state.retiring), lost_ranks=dict(self.lost),
            exits=tuple(self.exits),
            unknown_to_scheduler=frozenset(range(WORKERS)) - self.registered,
            node_range=self.node_range, round_nodes=self.round_nodes,
            waiting_nodes=frozenset(self.waiting_nodes), silent_since=dict(self.silent_since))

    def _rank_view(self, worker: Worker, undecided: bool) -> RankView:
        registered = True if worker.rank in self.registered else (
            None if self.scheduler_silent else False)
        cooldown = (self.cooldowns.get(worker.rank, 0.0)
                    if undecided and worker.state is WorkerState.FAILED and registered else 0.0)
        step = None if worker.child is None else self.steps.get(worker.child.pid)
        relaunched_after = self.state.relaunched_after.get(worker.rank)
        if worker.state is not WorkerState.RUNNING or step is not None:
            relaunched_after = None
        crash = relaunched_after if worker.state is WorkerState.RUNNING else worker.failure
        crash_step = None if crash is None or crash.pid is None else self.steps.get(crash.pid)
        finished_at = (worker.last_exit.at if worker.state is WorkerState.SUCCEEDED
                       and worker.last_exit is not None else None)
        seen = RankView(worker.rank, worker.state, worker.deadline, worker.failure, registered,
                        cooldown, worker.hung, worker.relaunch_why, step, crash_step,
                        relaunched_after, finished_at, retired=worker.rank in self.retired,
                        holds_rank=worker.state is WorkerState.RUNNING and worker.child is not None
                        and worker.child.pid in self.holding)
        since = absent_since(self.absent_since.get(worker.rank), seen)
        if since is None:
            self.absent_since.pop(worker.rank, None)
        else:
            self.absent_since[worker.rank] = since
        return replace(seen, absent_since=since)

    def _carry_out(self, action: Action) -> None:
        """Check ``action``, apply it to the supervisor's real :class:`JobState`, then do
        what launcher/supervisor/carry_out.py does outside it, without the processes."""
        match action:
            case Relaunch(rank):
                assert rank not in self.retired, f"retired rank {rank} relaunched"
                self._check_relaunch_alone(rank)
            case Retire(rank, _, deadline):
                self._check_retirement(rank)
                assert deadline <= self.now + RESTART_GRACE
            case StopWorkers(_, deadlines):
                assert all(at <= self.now + GRACE for at in deadlines.values())
            case RelaunchScheduler():
                assert self.scheduler_launches <= self.max_restarts
            case SchedulerSpent():
                assert self.scheduler_launches > self.max_restarts
            case StartAll(back):
                assert back == self.state.retired, "a group restart leaves ranks retired"
            case Close():
                assert not any(w.state in (WorkerState.RUNNING, WorkerState.STOPPING)
                               for w in self.workers)
        self.state.apply(action, self.now, self.workers)
        match action:
            case Hang(rank) | Kill(rank):
                self.killed.add(rank)
            case Relaunch(rank):
                self._launch(self.workers[rank])
            case StopWorkers() if self.restart_at is not None and self.ending is None:
                self.restart_stops.append(action)
            case TeardownCrash():
                self.teardown_crashes.append(action)
            case RelaunchScheduler():
                self.scheduler_alive = True
                self.scheduler_launches += 1
            case StartAll():
                followed = self.peer_restarts > self.restarts
                self.restarts = max(self.restarts + 1, self.peer_restarts)  # as the supervisor
                self.followed += followed
                self._next_round()
                for worker in self.workers:
                    self._launch(worker)
            case Close():
                self.closed = True

    def _next_round(self) -> None:
        """An elastic job's next generation: the nodes that still beat, and those that
        asked to join, up to MAX."""
        if self.node_range is None:
            return
        beating = [n for n in self.round_nodes if n not in self.silent_since]
        joining = sorted(self.waiting_nodes - set(beating))
        self.round_nodes = (*beating, *joining)[:self.node_range.high]
        self.other_ranks = WORKERS * (len(self.round_nodes) - 1)
        self.others_finished = not self.other_ranks
        self.silent_since.clear()
        self.waiting_nodes.clear()

    def _launch(self, worker: Worker) -> None:
        worker.incarnation += 1
        if self.spawn_fails:
            worker.launch_failed(Failure.of_spawn(worker.rank, worker.incarnation, self.now,
                                                  OSError(12, "Cannot allocate memory")))
        else:
            self.pids += 1
            worker.launched(_Process(self.pids))  # type: ignore[arg-type]

    def _exit(self, worker: Worker, code: int) -> None:
        if worker.state in (WorkerState.RUNNING, WorkerState.STOPPING):
            assert worker.child is not None
            info = ExitInfo("worker", worker.rank, worker.child.pid, worker.incarnation,
                            code, self.now, expected=worker.state is WorkerState.STOPPING)
            worker.ended(info)
            self.exits.append(info)

    # ------------------------------------------------------------ the invariants
    def _charged(self) -> int:
        """What this node charged to the budget; a restart another node started is
        charged there (the relaunches of single ranks are each node's own)."""
        following = self.peer_restarts > self.restarts  # charged where it was started
        pending = ((not following) if self.restart_at is not None
                   else sum(w.state is WorkerState.COOLDOWN for w in self.workers))
        return (self.restarts - self.followed - self.state.free_restarts + self.relaunches
                + pending)

    def _check_budget(self) -> None:
        assert self._charged() <= self.max_restarts, "the restart budget was exceeded"

    def _check_relaunch_alone(self, rank: int) -> None:
        """A rank relaunched alone must find every peer running, or relaunched too."""
        assert self.restart_at is None and self.ending is None
        finished = [w.rank for w in self.workers if w.state is WorkerState.SUCCEEDED]
        assert not finished, f"rank {rank} relaunched alone after ranks {finished} finished"
        assert self.workers[rank].deadline <= self.now

    @invariant()
    def budget_never_exceeded(self) -> None:
        self._check_budget()

    def _check_no_relaunch_waits_for_peers_that_are_gone(self) -> None:
        """A relaunch may wait while a peer finished only until it is due and the other
        peers had PEERS_SETTLE to finish too; then the group restarts (or the job ends)."""
        if self.ending is None and self.restart_at is None:
            cooling = [w for w in self.workers if w.state is WorkerState.COOLDOWN]
            finished = [w for w in self.workers if w.state is WorkerState.SUCCEEDED]
            if cooling and finished:
                due = max([w.deadline for w in cooling] + [
                    w.last_exit.at + PEERS_SETTLE for w in finished if w.last_exit])
                assert self.now < due, f"{cooling} wait to rejoin {finished}, gone"

    def _check_every_dead_rank_is_relaunched_or_the_job_ends(self) -> None:
        if self.ending is not None:
            assert self.ending.reason
            return
        dead = [w for w in self.workers
                if w.state is WorkerState.FAILED and self.restart_at is None]
        # The one wait allowed: under auto, for the scheduler to say whether a dead rank
        # registered (it decides between a relaunch and a group restart for all of them).
        asking = [w for w in dead if self.policy == "auto" and w.rank not in self.registered
                  and self.scheduler_silent and w.failure is not None
                  and self.now < w.failure.at + STATUS_WAIT]
        # Degraded training: a rank the budget cannot relaunch stays absent until it is
        # retired or the job ends (_check_absent_ranks_are_retired_or_the_job_ends).
        waiting = [w for w in dead if self._degraded() and w.rank in self.absent_since]
        assert not dead or asking or waiting, (
            f"ranks {[w.rank for w in dead]} are dead, nothing decided")
        settle = max((w.last_exit.at + PEERS_SETTLE for w in self.workers
                      if w.state is WorkerState.SUCCEEDED and w.last_exit), default=None)
        cooling = [w.deadline for w in self.workers if w.state is WorkerState.COOLDOWN]
        for worker in self.workers:
            if worker.state is WorkerState.COOLDOWN:
                # Once a peer finished, the relaunches wait to become one group restart:
                # until its PEERS_SETTLE ran and the last of them is due (see above).
                assert worker.deadline > self.now or (
                    settle is not None and max([settle, *cooling]) > self.now), (
                    f"rank {worker.rank}'s relaunch is overdue")

    def _check_the_other_nodes_are_followed(self) -> None:
        """Another node's end ends this one; its group restart restarts this one's workers,
        unless this node's job already ends or all its ranks finished."""
        if self.peer_end and self.signal is None:
            assert self.ending is not None
        if (self.peer_restarts > self.restarts and self.ending is None
                and not all(w.state is WorkerState.SUCCEEDED for w in self.workers)):
            assert self.restart_at is not None, "another node's group restart was not followed"

    def _check_the_job_ends_once_all_ranks_succeeded(self) -> None:
        if all(w.state is WorkerState.SUCCEEDED for w in self.workers
               if w.rank not in self.retired):
            assert self.ending is not None
            assert self.ending.status in (0, *(128 + s for s in DEFAULT_SIGNALS))

    def _check_the_scheduler(self, view: JobView, actions: list[Action]) -> None:
        """A dead scheduler is relaunched at once while its budget lasts, never after."""
        decided = [a for a in actions if isinstance(a, (RelaunchScheduler, SchedulerSpent))]
        assert len(decided) == (1 if view.scheduler_exit else 0)
        assert self.scheduler_launches <= self.max_restarts + 1

    def _check_a_lost_node_ends_the_job(self) -> None:
        if self.missing_since is not None and self.now - self.missing_since >= NODE_TIME_OUT:
            assert self.ending is not None

    def _check_a_stranded_rank_ends_the_job(self) -> None:
        """Every other rank exited 0 and the ranks left were relaunched alone (waiting,
        or running with no step): the job ends; 0 only if each had reached the final step."""
        if self.teardown_crashes:
            assert self.ending is not None and self.ending.status == 0
            assert all(c.step >= c.final_step for c in self.teardown_crashes)
        if self.ending is not None or self.restart_at is not None:
            return
        left = [w for w in self.workers
                if w.state is not WorkerState.SUCCEEDED and w.rank not in self.retired]
        peers = len(self.workers) - len(left) - len(self.retired) + self.other_ranks
        stranded = [w for w in left if w.state is WorkerState.COOLDOWN or (
            w.state is WorkerState.RUNNING and w.rank in self.state.relaunched_after
            and w.child is not None and w.child.pid not in self.steps)]
        assert not (left and peers and self.others_finished and len(stranded) == len(left)), (
            f"ranks {[w.rank for w in left]} wait for peers that all finished")

    def _check_the_restart_grace(self) -> None:
        """A group restart gives a rank that never registered at most RESTART_GRACE."""
        for stop in self.restart_stops:
            for rank, deadline in stop.deadlines.items():
                if rank not in self.registered:
                    assert deadline <= self.now + RESTART_GRACE
        self.restart_stops.clear()


    # ------------------------------------------------------------ degraded training
    def _degraded(self) -> bool:
        return bool(self.registered) and self.min_worker_num < WORKERS + self.other_ranks

    def _absent(self) -> dict[int, float]:
        """The absent ranks not retired, this node's and the lost node's: since when."""
        return {rank: since for rank, since in {**self.absent_since, **self.lost}.items()
                if rank not in self.retired}

    def _training(self) -> int:
        """The job's ranks less the absent, the retired and the lost."""
        absent = set(self.absent_since) - self.retired
        return (WORKERS - len(self.state.retired) - len(absent)
                + self.other_ranks - len(self.lost))

    def _check_retirement(self, rank: int) -> None:
        """Only with degraded training, only an absent rank (this node's, or the lost
        node's), only once it was absent for --rejoin_timeout, and only while enough ranks
        train on."""
        assert self._degraded()
        assert rank in self._absent(), f"rank {rank} retired, not absent"
        if rank < WORKERS:
            worker = self.workers[rank]
            assert worker.child is None or worker.state is not WorkerState.RUNNING \
                or worker.child.pid not in self.holding, f"rank {rank} registered again, retired"
        assert self.now >= self._absent()[rank] + REJOIN_TIMEOUT
        assert self._training() >= self.min_worker_num

    def _check_absent_ranks_are_retired_or_the_job_ends(self) -> None:
        """No rank stays absent past --rejoin_timeout while enough train, a lost node's
        included; with too few for --node_time_out since every absence began, the job
        ends."""
        if not self._degraded() or self.ending is not None or self.restart_at is not None:
            return
        absent = self._absent()
        overdue = [r for r, since in absent.items() if self.now >= since + REJOIN_TIMEOUT]
        if self._training() >= self.min_worker_num:
            assert not overdue, f"ranks {overdue} absent past --rejoin_timeout, not retired"
        elif absent:
            assert self.now < max(absent.values()) + NODE_TIME_OUT, (
                "too few ranks train for --node_time_out, and the job goes on")

    def _check_exit_reports(self, view: JobView, actions: list[Action]) -> None:
        """The scheduler hears of every fault, and of no ordinary end of a rank it never
        knew."""
        reported = [a.exit for a in actions if isinstance(a, ReportExit)]
        for info in view.exits:
            abnormal = not (info.expected or info.succeeded)
            assert (info in reported) == (abnormal or info.rank in self.registered), info

    def _check_the_node_range(self) -> None:
        """Node 0 of an elastic range: a node of the generation silent for --node_time_out,
        or a node asking to join while the generation is below MAX, restarts the group (or
        ends the job below MIN) at once."""
        if self.node_range is None or self.ending is not None or self.restart_at is not None:
            return
        silent = [n for n, since in self.silent_since.items() if self.now >= since + NODE_TIME_OUT]
        assert not silent, f"nodes {silent} silent for --node_time_out, nothing decided"
        joining = self.waiting_nodes - set(self.round_nodes)
        assert not joining or len(self.round_nodes) >= self.node_range.high, (
            f"nodes {sorted(joining)} wait to join a generation below MAX")


SETTINGS = settings(max_examples=80, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def test_the_restart_policy_under_random_events() -> None:
    run_state_machine_as_test(PolicyMachine, settings=SETTINGS)


class DegradedPolicyMachine(PolicyMachine):
    """The same world with degraded training on and every rank relaunched alone (rarely
    drawn together above): deaths, relaunches that fail, the budget spent, retirements."""

    @initialize(max_restarts=st.integers(0, 3), min_worker_num=st.sampled_from([1, 2]),
                other_ranks=st.sampled_from([0, 0, 3]))
    def start(self, max_restarts: int, min_worker_num: int, other_ranks: int) -> None:
        self.max_restarts, self.policy = max_restarts, RestartPolicy.RANK
        self.registered, self.min_worker_num = set(range(WORKERS)), min_worker_num
        self.other_ranks, self.others_finished = other_ranks, not other_ranks
        for worker in self.workers:
            self._launch(worker)

    @precondition(lambda self: not self.closed)
    @rule(rank=ranks, code=st.sampled_from([0, 1, -9]))
    def process_exits(self, rank: int, code: int) -> None:
        self._exit(self.workers[rank], code)

    # The ends that have nothing to do with degraded training, left out so that the
    # drawn jobs live long enough for absences, relaunches and retirements.
    tftrun_is_signalled = another_node_ends_the_job = another_node_restarts_all = None  # type: ignore[assignment]
    scheduler_dies = None  # type: ignore[assignment]


def test_degraded_training_under_random_events() -> None:
    run_state_machine_as_test(DegradedPolicyMachine, settings=SETTINGS)


class ElasticPolicyMachine(PolicyMachine):
    """The same world on node 0 of an elastic range (``--nnodes=MIN:3``): nodes of the
    generation fall silent or beat again, nodes ask to join, and the group restarts."""

    @initialize(max_restarts=st.integers(0, 3), fewest_nodes=st.sampled_from([1, 2]),
                registered=st.sets(ranks))
    def start(self, max_restarts: int, fewest_nodes: int, registered: set[int]) -> None:
        super().start(max_restarts, RestartPolicy.AUTO, registered, WORKERS, "size", fewest_nodes)

    tftrun_is_signalled = another_node_ends_the_job = scheduler_dies = None  # type: ignore[assignment]


def test_an_elastic_node_range_under_random_events() -> None:
    run_state_machine_as_test(ElasticPolicyMachine, settings=SETTINGS)


@pytest.mark.parametrize("code", sorted(UNFIXABLE))
def test_an_exit_no_restart_can_fix_ends_the_job_at_once(code: int) -> None:
    failure = Failure(1, 42, 0, 0.0, code, f"exited with code {code}", f"exit code {code}", code)
    view = JobView((RankView(0, WorkerState.RUNNING),
                    RankView(1, WorkerState.FAILED, failure=failure, registered=True)),
                   max_restarts=3)
    [give_up, stop] = decide(view, 1.0)
    assert isinstance(give_up, GiveUp) and give_up.failure is failure
    assert UNFIXABLE[code] in give_up.reason
    assert stop == StopWorkers(15, {0: 1.0 + view.grace_period})


def _failed(rank: int, at: float = 0.0) -> Failure:
    return Failure(rank, 40 + rank, 0, at, 1, "exited with code 1", "exit code 1", 1)


def test_a_relaunch_waiting_when_a_peer_finishes_becomes_a_group_restart() -> None:
    """Rank 1 died first and waits out its cooldown; rank 0 then exits 0 while rank 2
    runs. Relaunched alone, rank 1 would wait for peers that are gone: once its relaunch
    is due and rank 2 had PEERS_SETTLE to finish too (it did not), the group restarts."""
    def view(finished_at: float) -> JobView:
        return JobView((RankView(0, WorkerState.SUCCEEDED, finished_at=finished_at),
                        RankView(1, WorkerState.COOLDOWN, deadline=5.0, failure=_failed(1),
                                 registered=True, relaunch_why="rank 1 exited with code 1"),
                        RankView(2, WorkerState.RUNNING)), max_restarts=1)

    assert decide(view(0.5), 1.0) == [WaitUntil(5.0)]
    assert decide(view(4.0), 5.0) == [WaitUntil(4.0 + PEERS_SETTLE)]
    [restart, stop] = decide(view(0.5), 5.5)
    assert restart == RestartAll(5.5, "rank 1 exited with code 1 after ranks [0] finished: "
                                      "a relaunched rank could not rejoin them")
    assert stop == StopWorkers(15, {2: 5.5 + RESTART_GRACE})  # rank 2 never registered


def test_two_deaths_at_once_are_charged_two_relaunches_when_decided() -> None:
    view = JobView(tuple(RankView(r, WorkerState.FAILED, failure=_failed(r), registered=True)
                         for r in (0, 1)) + (RankView(2, WorkerState.RUNNING),),
                   max_restarts=1, restart_policy=RestartPolicy.RANK)
    [give_up, _] = decide(view, 1.0)
    assert isinstance(give_up, GiveUp) and "restart budget (1) spent" in give_up.reason
    relaunches = decide(JobView(view.ranks, max_restarts=2, restart_policy=RestartPolicy.RANK),
                       1.0)
    assert relaunches[:2] == [ScheduleRelaunch(0, 1.0, "rank 0 exited with code 1"),
                              ScheduleRelaunch(1, 1.0, "rank 1 exited with code 1")]


@pytest.mark.parametrize(("crash_step", "status"), [(5, 0), (3, 3), (None, 3)])
@pytest.mark.parametrize("state", [WorkerState.COOLDOWN, WorkerState.RUNNING])
def test_a_rank_relaunched_alone_whose_peers_all_finished_ends_the_job(
        state: WorkerState, crash_step: int | None, status: int) -> None:
    """Rank 1 exited 3 and was relaunched alone (still waiting, or running with no step);
    ranks 0 and 2 then exited 0 at step 5. The job ends at once: 0 and a warning when the
    crash came after step 5 (a teardown's crash), else the crash's status."""
    crash = Failure(1, 41, 0, 0.0, 3, "exited with code 3", "exit code 3", 3)
    rank_1 = (RankView(1, state, deadline=30.0, failure=crash, registered=True,
                       failure_step=crash_step)
              if state is WorkerState.COOLDOWN else
              RankView(1, state, registered=True, failure_step=crash_step, relaunched_after=crash))
    view = JobView((RankView(0, WorkerState.SUCCEEDED, step=5), rank_1,
                    RankView(2, WorkerState.SUCCEEDED, step=5)), max_restarts=3)
    actions = decide(view, 1.0)
    stop = StopWorkers(15, {1: 1.0 + RESTART_GRACE} if state is WorkerState.RUNNING else {})
    if status == 0:
        assert actions == [TeardownCrash(1, crash, 5, 5),
                           Stop(0, "all workers finished (rank 1 exited with code 3 in its "
                                   "teardown, after the final step 5)"), stop]
    else:
        [give_up, stopping] = actions
        assert isinstance(give_up, GiveUp) and give_up.failure is crash
        assert "before its peers' final step 5" in give_up.reason and stopping == stop


@pytest.mark.parametrize(("min_worker_num", "status"), [(2, 0), (3, 3), (4, 3)])
def test_with_degraded_training_a_rank_still_rejoining_when_its_peers_finished_ends_the_job_well(
        min_worker_num: int, status: int) -> None:
    """Rank 1 died at step 3 and runs again, not yet rejoined; ranks 0 and 2 finished at
    step 5. With ``--min_worker_num=2`` they trained on without it (docs/elastic.md): the
    job succeeded. Otherwise the crash's status, as before."""
    crash = Failure(1, 41, 0, 0.0, 3, "exited with code 3", "exit code 3", 3)
    view = JobView((RankView(0, WorkerState.SUCCEEDED, step=5),
                    RankView(1, WorkerState.RUNNING, registered=True, failure_step=3,
                             relaunched_after=crash),
                    RankView(2, WorkerState.SUCCEEDED, step=5)), max_restarts=3,
                   min_worker_num=min_worker_num)
    [ending, stopping] = decide(view, 1.0)
    assert stopping == StopWorkers(15, {1: 1.0 + RESTART_GRACE})
    if status == 0:
        assert ending == Stop(0, "all workers finished; the survivors trained on without "
                                 "rank 1 (exited with code 3)")
    else:
        assert isinstance(ending, GiveUp) and ending.failure is crash


def test_with_degraded_training_a_rank_the_budget_cannot_relaunch_is_retired_in_time() -> None:
    """Rank 1 died at 0.0 and its budget is spent: the job does not end, the rank waits;
    at ``--rejoin_timeout`` it is retired while two ranks train on (``--min_worker_num=2``),
    and the job ends well without it. Without degraded training the spent budget ends the
    job at once, as before; with two ranks dead (one trains, fewer than 2) none is retired
    and the job ends ``--node_time_out`` after the death that left too few."""
    def view(min_worker_num: int, rank_1: RankView) -> JobView:
        return JobView((RankView(0, WorkerState.RUNNING), rank_1, RankView(2, WorkerState.RUNNING)),
                       max_restarts=0, min_worker_num=min_worker_num,
                       rejoin_timeout=60.0, node_time_out=600.0)

    dead = RankView(1, WorkerState.FAILED, failure=_failed(1), registered=True, absent_since=0.0)
    assert decide(view(2, dead), 1.0) == [WaitUntil(60.0)]
    [retire, _wait] = decide(view(2, dead), 60.0)
    assert retire == Retire(1, "rank 1 (exited with code 1) was not back within "
                               "--rejoin_timeout=60s", 60.0 + RESTART_GRACE)
    retired = RankView(1, WorkerState.STOPPED, retired=True)
    assert decide(view(2, retired), 61.0) == [WaitUntil(float("inf"))]
    done = JobView((RankView(0, WorkerState.SUCCEEDED), retired,
                    RankView(2, WorkerState.SUCCEEDED)), max_restarts=0,
                   min_worker_num=2)
    assert decide(done, 62.0) == [Stop(0, "all workers succeeded; ranks [1] were retired")]

    [spent, _stop] = decide(view(3, dead), 1.0)  # 3 is the job's size: no degraded training
    assert isinstance(spent, GiveUp) and spent.reason.endswith("restart budget (0) spent")
    # Two dead, one trains: fewer than 2, none retired. Rank 2's relaunch waits out its
    # cooldown: the job waits --node_time_out from the death that left too few.
    cooling = RankView(2, WorkerState.COOLDOWN, deadline=650.0, failure=_failed(2, 5.0),
                       registered=True, absent_since=5.0, relaunch_why="rank 2 exited with code 1")
    two_dead = JobView((RankView(0, WorkerState.RUNNING), dead, cooling),
                       max_restarts=1, min_worker_num=2, rejoin_timeout=60.0,
                       node_time_out=600.0)
    assert decide(two_dead, 60.0) == [WaitUntil(605.0)]
    [give_up, _stop] = decide(two_dead, 605.0)
    assert isinstance(give_up, GiveUp) and give_up.reason == (
        "1 of 3 ranks train, fewer than --min_worker_num=2, and ranks [1, 2] were not back "
        "within --node_time_out=600s")
    # Both failed and the budget spent: neither can come back, the job ends at once.
    spent_both = replace(two_dead, ranks=(RankView(0, WorkerState.RUNNING), dead, RankView(
        2, WorkerState.FAILED, failure=_failed(2, 5.0), registered=True, absent_since=5.0)),
        max_restarts=0)
    [give_up, _stop] = decide(spent_both, 6.0)
    assert isinstance(give_up, GiveUp) and give_up.failure == dead.failure
    assert give_up.reason == ("1 of 3 ranks train, fewer than --min_worker_num=2, and ranks "
                              "[1, 2] cannot be relaunched; restart budget (0) spent")


def test_a_retired_rank_does_not_count_as_a_peer_that_finished() -> None:
    """Rank 1 was retired; rank 0 finished at step 5; rank 2, relaunched after a crash at
    step 3, is still starting. One peer finished, fewer than ``--min_worker_num=2``: the
    job did not train on without rank 2, so it ends with rank 2's crash."""
    crash = Failure(2, 42, 0, 0.0, 3, "exited with code 3", "exit code 3", 3)
    view = JobView((RankView(0, WorkerState.SUCCEEDED, step=5),
                    RankView(1, WorkerState.STOPPED, retired=True),
                    RankView(2, WorkerState.RUNNING, registered=True, failure_step=3,
                             relaunched_after=crash)), max_restarts=3,
                   min_worker_num=2)
    [ending, _stopping] = decide(view, 1.0)
    assert isinstance(ending, GiveUp) and ending.failure is crash


@settings(max_examples=300, deadline=None)
@given(data=st.data(), others=st.integers(2, 6), now=st.floats(0.0, 100.0))
def test_node_0_counts_the_ranks_training_across_nodes_and_retires_a_lost_nodes_in_time(
        data: st.DataObject, others: int, now: float) -> None:
    """Node 0 (2 ranks, both training) of a job whose other nodes hold ``others`` ranks,
    of which the scheduler holds ``training`` live; some of the others are a lost node's
    (their node silent since a drawn time). While at least ``--min_worker_num`` ranks
    train across nodes, exactly the lost ranks absent for ``--rejoin_timeout`` are
    retired and the job goes on; with fewer, none is retired, and the job ends for every
    node, never before ``--node_time_out`` after the first loss, always once it passed
    the last one."""
    training = data.draw(st.integers(0, others - 1), label="training")
    lost_count = data.draw(st.integers(1, others - training), label="lost")
    lost = {2 + r: data.draw(st.floats(0.0, now), label=f"since {2 + r}")
            for r in range(lost_count)}
    size = 2 + others
    min_worker_num = data.draw(st.integers(1, size - 1), label="min_worker_num")
    view = JobView((RankView(0, WorkerState.RUNNING, registered=True),
                    RankView(1, WorkerState.RUNNING, registered=True)), max_restarts=3,
                   other_ranks=others, others_finished=False,
                   min_worker_num=min_worker_num, rejoin_timeout=REJOIN_TIMEOUT,
                   node_time_out=NODE_TIME_OUT, others_training=training, lost_ranks=lost)
    actions = decide(view, now)
    retired = [a.rank for a in actions if isinstance(a, Retire)]
    ends = [a for a in actions if isinstance(a, (Stop, GiveUp))]
    if 2 + training >= min_worker_num:
        assert retired == sorted(r for r, since in lost.items() if now >= since + REJOIN_TIMEOUT)
        assert not ends
        assert decide(replace(view, others_retired=frozenset(lost)), now) == [
            WaitUntil(float("inf"))]  # retired: not awaited any more
        return
    assert not retired
    if now < min(lost.values()) + NODE_TIME_OUT:
        assert not ends
    elif now >= max(lost.values()) + NODE_TIME_OUT:
        [end] = ends
        assert end == Stop(EXIT_PEER_ENDED, f"node 0: {2 + training} of {size} ranks train, "
                           f"fewer than --min_worker_num={min_worker_num}, and ranks "
                           f"{sorted(lost)} were not back within "
                           f"--node_time_out={NODE_TIME_OUT:g}s", everywhere=True)


def test_a_node_counts_the_other_nodes_ranks_that_do_not_train() -> None:
    """Node 1 (ranks 2, 3) of a 4-rank job, ``--min_worker_num=3``: its rank 2 is absent
    past ``--rejoin_timeout`` (its relaunch waits out a long cooldown) while the scheduler
    holds only one of node 0's ranks live.
    Two ranks train, fewer than 3: rank 2 is not retired (it was, when every other
    node's rank counted as training), and the job ends at ``--node_time_out``."""
    absent = RankView(2, WorkerState.COOLDOWN, deadline=10 * NODE_TIME_OUT, failure=_failed(2),
                      registered=True, absent_since=0.0, relaunch_why="rank 2 exited with code 1")
    view = JobView((absent, RankView(3, WorkerState.RUNNING, registered=True)),
                   max_restarts=1, other_ranks=2, others_finished=False,
                   node_rank=1, min_worker_num=3, rejoin_timeout=REJOIN_TIMEOUT,
                   node_time_out=NODE_TIME_OUT, others_training=1)
    assert decide(view, REJOIN_TIMEOUT) == [WaitUntil(NODE_TIME_OUT)]
    assert decide(replace(view, others_training=2), REJOIN_TIMEOUT)[0] == Retire(
        2, f"rank 2 (exited with code 1) was not back within --rejoin_timeout={REJOIN_TIMEOUT:g}s",
        REJOIN_TIMEOUT + RESTART_GRACE)


def test_a_rank_the_scheduler_retired_is_stopped_and_never_relaunched() -> None:
    """The scheduler retired rank 1 as it judged it (a straggler evicted again soon after
    its relaunch): it is stopped with a ``Retire`` (no ``Hang``), and once retired it is not
    relaunched, and the job ends well without it; a plain verdict is still a ``Hang``."""
    def view(rank_1: RankView, verdicts: dict[int, str]) -> JobView:
        return JobView((RankView(0, WorkerState.RUNNING), rank_1, RankView(2, WorkerState.RUNNING)),
                       max_restarts=3, verdicts=verdicts, min_worker_num=2)

    running = RankView(1, WorkerState.RUNNING, registered=True)
    retire, *_rest = decide(view(running, {1: RETIRED_VERDICT}), 1.0)
    assert retire == Retire(1, "the scheduler retired rank 1 as it judged it lost", 1.0 + RESTART_GRACE)
    assert not any(isinstance(a, Hang) for a in decide(view(running, {1: RETIRED_VERDICT}), 1.0))
    assert Hang(1, "heartbeat") in decide(view(running, {1: "heartbeat"}), 1.0)
    stopped = RankView(1, WorkerState.STOPPED, retired=True)
    assert decide(view(stopped, {}), 2.0) == [WaitUntil(float("inf"))]
    failed = RankView(1, WorkerState.FAILED, failure=_failed(1), registered=True, retired=True)
    assert not any(isinstance(a, (ScheduleRelaunch, RestartAll))
                   for a in decide(view(failed, {}), 2.0))


@pytest.mark.parametrize("node_rank", [0, 1])
def test_a_round_that_did_not_form_ends_the_job_through_decide(node_rank: int) -> None:
    """An elastic job's round with too few nodes ends the job (node 0 ends it for every
    node); a round a node could not join because the job ended well ends it with 0."""
    pending = (RankView(0, WorkerState.PENDING), RankView(1, WorkerState.PENDING))
    too_few = TooFew("node 0: group restart 2: 1 of the job's nodes (at least 2 needed)")
    assert decide(JobView(pending, max_restarts=3, node_rank=node_rank, round_outcome=too_few),
                  1.0) == [Stop(EXIT_PEER_ENDED, too_few.reason, everywhere=node_rank == 0)]
    done = JobDone(f"node {node_rank}: the job ended before group restart 2")
    assert decide(JobView(pending, max_restarts=3, node_rank=node_rank, round_outcome=done),
                  1.0) == [Stop(0, done.reason)]


@pytest.mark.parametrize("round_nodes", [(), (0, 1)])
def test_node_0_of_an_elastic_job_that_ended_well_closes_its_rounds(round_nodes: tuple[int, ...]) -> None:
    done = (RankView(0, WorkerState.SUCCEEDED), RankView(1, WorkerState.SUCCEEDED))
    [stop] = decide(JobView(done, max_restarts=3, round_nodes=round_nodes), 1.0)
    assert stop == Stop(0, "all workers succeeded", close_rounds=bool(round_nodes))


def test_a_group_restart_brings_back_every_retired_rank_and_the_state_forgets_them() -> None:
    """Rank 1 was retired; once the group restart is due and nothing runs, ``StartAll``
    names it, and :class:`JobState` holds no rank retired after applying it."""
    ranks = (RankView(0, WorkerState.STOPPED), RankView(1, WorkerState.STOPPED, retired=True))
    actions = decide(JobView(ranks, max_restarts=3, restart_at=1.0, restarts=0), 1.0)
    assert StartAll(frozenset({1})) in actions
    state = JobState(restart_at=1.0, retired={1})
    state.apply(StartAll(frozenset({1})), 1.0, [Worker(0, 0), Worker(1, 1)])
    assert state.retired == set() and state.restart_at is None


def test_while_a_round_forms_only_the_jobs_end_and_the_scheduler_act() -> None:
    """No worker of this node runs while an elastic job's round forms: the policy waits
    for it, a look at a time; a signal still ends the job, and a dead scheduler is still
    relaunched."""
    pending = (RankView(0, WorkerState.STOPPED), RankView(1, WorkerState.STOPPED))
    forming = JobView(pending, max_restarts=3, round_forming=True, scheduler_launches=1)
    assert decide(forming, 5.0) == [WaitUntil(5.0 + ROUND_POLL)]
    assert decide(replace(forming, signal=15), 5.0) == [Stop(143, "received SIGTERM"),
                                                         StopWorkers(15, {})]
    assert decide(replace(forming, scheduler_exit="exited with code 1"), 5.0) == [
        RelaunchScheduler("scheduler exited with code 1"), WaitUntil(5.0 + ROUND_POLL)]
