"""The restart policy (launcher/supervisor/policy.py) under random sequences of events, with Hypothesis.

A ``RuleBasedStateMachine`` plays the world around ``decide``: worker exits (0 is a
finish), SIGINT/SIGTERM to tftrun, the scheduler's verdicts, registrations and
cooldowns, a scheduler that does not answer, launches that cannot be started, and the
clock. Each ``supervise`` step runs the supervisor's passes: it builds the view, calls
``decide`` and carries the actions out on real :class:`launcher.supervisor.state.Worker` objects,
as launcher/supervisor/loop.py does, so a move the transition table forbids raises. After
every pass it checks the invariants of issue 15: no illegal transition, the budget
never exceeded, no rank relaunched alone into a generation that cannot form, every dead
rank relaunched or the job ending with a reason, the job ending once all ranks succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test,
)

from launcher.config import RESTART_POLICIES
from launcher.supervisor.failures import ExitInfo
from launcher.supervisor.policy import (
    STATUS_WAIT, Action, Close, Ending, GiveUp, Hang, JobView, Kill, RankView, Relaunch,
    RestartAll, ScheduleRelaunch, StartAll, Stop, WaitUntil, decide,
)
from launcher.supervisor.state import Failure, Worker, WorkerState
from recovery.exit_codes import UNFIXABLE

WORKERS = 3
GRACE = 10.0
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
        self.restarts = 0
        self.relaunches = 0
        self.restart_at: float | None = None
        self.ending: Ending | None = None
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

    # ------------------------------------------------------------ the world
    @initialize(max_restarts=st.integers(0, 4), policy=st.sampled_from(RESTART_POLICIES),
                registered=st.sets(ranks))
    def start(self, max_restarts: int, policy: str, registered: set[int]) -> None:
        self.max_restarts, self.policy, self.registered = max_restarts, policy, registered
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
    @rule(signum=st.sampled_from([2, 15]))
    def tftrun_is_signalled(self, signum: int) -> None:
        self.signal = self.signal or signum

    @precondition(lambda self: not self.closed)
    @rule(rank=ranks)
    def rank_registers(self, rank: int) -> None:
        self.registered.add(rank)

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
            actions = decide(self._view(), self.now)
            self.verdicts.clear()
            for action in actions:
                self._carry_out(action)
                self._check_budget()
            if all(isinstance(a, (WaitUntil, Kill)) for a in actions) or self.closed:
                break
        else:
            pytest.fail(f"the policy still acts after {PASSES} passes at the same moment")
        self._check_no_relaunch_waits_for_peers_that_are_gone()
        self._check_every_dead_rank_is_relaunched_or_the_job_ends()
        self._check_the_job_ends_once_all_ranks_succeeded()
        self._check_the_other_nodes_are_followed()

    def _view(self) -> JobView:
        undecided = self.restart_at is None and self.ending is None
        return JobView(
            tuple(self._rank_view(w, undecided) for w in self.workers), self.max_restarts,
            self.policy, self.restarts, self.relaunches, self.restart_at, self.ending,
            self.signal, dict(self.verdicts),
            f"another node started group restart {self.peer_restarts}"
            if self.peer_restarts > self.restarts else "", self.peer_end)

    def _rank_view(self, worker: Worker, undecided: bool) -> RankView:
        registered = True if worker.rank in self.registered else (
            None if self.scheduler_silent else False)
        cooldown = (self.cooldowns.get(worker.rank, 0.0)
                    if undecided and worker.state is WorkerState.FAILED and registered else 0.0)
        return RankView(worker.rank, worker.state, worker.deadline, worker.failure, registered,
                        cooldown, worker.hung, worker.relaunch_why)

    def _carry_out(self, action: Action) -> None:
        """What launcher/supervisor/loop.py's ``_carry_out`` does, without the processes."""
        match action:
            case Hang(rank, _):
                self.workers[rank].hung = True
                self.killed.add(rank)
            case ScheduleRelaunch(rank, at, why):
                worker = self.workers[rank]
                worker.transition(WorkerState.COOLDOWN, deadline=at)
                worker.relaunch_why = why
            case Relaunch(rank):
                self._check_relaunch_alone(rank)
                self.relaunches += 1
                self._launch(self.workers[rank])
            case RestartAll(at, _):
                self.restart_at = at
                self._stop_workers()
            case StartAll():
                self.restart_at = None
                followed = self.peer_restarts > self.restarts
                self.restarts = max(self.restarts + 1, self.peer_restarts)  # as the supervisor
                self.followed += followed
                for worker in self.workers:
                    self._launch(worker)
            case Stop(status, reason):
                self._end(Ending(status, reason))
            case GiveUp(failure, reason):
                self._end(Ending(failure.exit_status, reason, failure))
            case Kill(rank):
                self.killed.add(rank)
            case Close():
                assert not any(w.state in (WorkerState.RUNNING, WorkerState.STOPPING)
                               for w in self.workers)
                self.closed = True
            case WaitUntil():
                pass

    def _end(self, ending: Ending) -> None:
        self.ending, self.restart_at = ending, None
        self._stop_workers()

    def _stop_workers(self) -> None:
        for worker in self.workers:
            if worker.state is WorkerState.RUNNING:
                worker.transition(WorkerState.STOPPING, deadline=self.now + GRACE)
            elif worker.state is WorkerState.COOLDOWN:
                worker.transition(WorkerState.STOPPED)

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
            worker.ended(ExitInfo("worker", worker.rank, worker.child.pid, worker.incarnation,
                                  code, self.now, expected=worker.state is WorkerState.STOPPING))

    # ------------------------------------------------------------ the invariants
    def _charged(self) -> int:
        """What this node charged to the budget; a restart another node started is
        charged there (the relaunches of single ranks are each node's own)."""
        pending = (1 if self.restart_at is not None
                   else sum(w.state is WorkerState.COOLDOWN for w in self.workers))
        return self.restarts - self.followed + self.relaunches + pending

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
        if self.ending is None and self.restart_at is None:
            cooling = [w.rank for w in self.workers if w.state is WorkerState.COOLDOWN]
            finished = [w.rank for w in self.workers if w.state is WorkerState.SUCCEEDED]
            assert not (cooling and finished), f"{cooling} wait to rejoin {finished}, gone"

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
        assert not dead or asking, f"ranks {[w.rank for w in dead]} are dead, nothing decided"
        for worker in self.workers:
            if worker.state is WorkerState.COOLDOWN:
                assert worker.deadline > self.now, f"rank {worker.rank}'s relaunch is overdue"

    def _check_the_other_nodes_are_followed(self) -> None:
        """Another node's end ends this one; its group restart restarts this one's workers,
        unless this node's job already ends or all its ranks finished."""
        if self.peer_end and self.signal is None:
            assert self.ending is not None
        if (self.peer_restarts > self.restarts and self.ending is None
                and not all(w.state is WorkerState.SUCCEEDED for w in self.workers)):
            assert self.restart_at is not None, "another node's group restart was not followed"

    def _check_the_job_ends_once_all_ranks_succeeded(self) -> None:
        if all(w.state is WorkerState.SUCCEEDED for w in self.workers):
            assert self.ending is not None and self.ending.status in (0, 130, 143)



SETTINGS = settings(max_examples=80, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def test_the_restart_policy_under_random_events() -> None:
    run_state_machine_as_test(PolicyMachine, settings=SETTINGS)


@pytest.mark.parametrize("code", sorted(UNFIXABLE))
def test_an_exit_no_restart_can_fix_ends_the_job_at_once(code: int) -> None:
    failure = Failure(1, 42, 0, 0.0, code, f"exited with code {code}", f"exit code {code}", code)
    view = JobView((RankView(0, WorkerState.RUNNING),
                    RankView(1, WorkerState.FAILED, failure=failure, registered=True)),
                   max_restarts=3)
    [give_up] = decide(view, 1.0)
    assert isinstance(give_up, GiveUp) and give_up.failure is failure
    assert UNFIXABLE[code] in give_up.reason


def _failed(rank: int, at: float = 0.0) -> Failure:
    return Failure(rank, 40 + rank, 0, at, 1, "exited with code 1", "exit code 1", 1)


def test_a_relaunch_waiting_when_a_peer_finishes_becomes_a_group_restart() -> None:
    """The teardown case: rank 1 died first and waits out its cooldown; rank 0 then exits
    0. Relaunched alone, rank 1 would wait for peers that are gone."""
    view = JobView((RankView(0, WorkerState.SUCCEEDED),
                    RankView(1, WorkerState.COOLDOWN, deadline=5.0, failure=_failed(1),
                             registered=True, relaunch_why="rank 1 exited with code 1"),
                    RankView(2, WorkerState.RUNNING)), max_restarts=1)
    [restart] = decide(view, 1.0)
    assert restart == RestartAll(5.0, "rank 1 exited with code 1 after ranks [0] finished: "
                                      "a relaunched rank could not rejoin them")


def test_two_deaths_at_once_are_charged_two_relaunches_when_decided() -> None:
    view = JobView(tuple(RankView(r, WorkerState.FAILED, failure=_failed(r), registered=True)
                         for r in (0, 1)) + (RankView(2, WorkerState.RUNNING),),
                   max_restarts=1, restart_policy="rank")
    [give_up] = decide(view, 1.0)
    assert isinstance(give_up, GiveUp) and "restart budget (1) spent" in give_up.reason
    relaunches = decide(JobView(view.ranks, max_restarts=2, restart_policy="rank"), 1.0)
    assert relaunches[:2] == [ScheduleRelaunch(0, 1.0, "rank 0 exited with code 1"),
                              ScheduleRelaunch(1, 1.0, "rank 1 exited with code 1")]
