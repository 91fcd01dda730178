"""The scheduler's membership rules, on a fake clock: exact and fast."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.control.members import Identity, Member, MemberState, RefuseReason
from recovery.control.membership import Membership
from recovery.transitions import IllegalTransition
from support.fake_clock import T0, FakeClock
from support.membership import TOKEN, accepted, ident, join_all, make, names, refused


# ----------------------------------------------------------------- joining and ranks
def test_numeric_node_ids_keep_their_rank_and_a_full_cluster_forms_a_generation() -> None:
    ms = make(worker_num=2)
    first = accepted(ms.register(ident("1", 101), TOKEN))
    assert ms.generation == -1  # none formed yet
    assert (first.node_id, first.rank, first.generation) == ("1", 1, 0)
    assert not ms.complete and ms.missing_ranks() == [0]
    second = accepted(ms.register(ident("0", 100), TOKEN))
    assert (second.rank, second.generation) == (0, 0)
    assert ms.complete and ms.generation == 0
    events = ms.drain_events()
    assert [name for name, _ in events] == ["register", "register", "generation", "membership"]
    assert events[3][1] == {"active": [0, 1], "world": 2, "generation": 0, "why": "start",
                            "lost": [], "joined": []}
    assert events[0][1] == {"node_id": "1", "rank": 1, "pid": 101, "incarnation": 0,
                            "host": "host-a", "generation": 0}
    assert [m["rank"] for m in events[2][1]["members"]] == [0, 1]


def test_workers_without_node_id_get_the_lowest_free_rank() -> None:
    ms = make(worker_num=3)
    accepted(ms.register(ident("1", 101), TOKEN))
    assert accepted(ms.register(ident("", 200), TOKEN)).node_id == "0"
    assert accepted(ms.register(ident("", 201), TOKEN)).node_id == "2"
    refused(ms.register(ident("", 202), TOKEN), RefuseReason.FULL)


def test_a_named_node_keeps_its_assigned_rank_across_relaunches() -> None:
    ms = make(worker_num=3)
    accepted(ms.register(ident("alpha", 100), TOKEN))
    beta = accepted(ms.register(ident("beta", 101), TOKEN))
    ms.report_exit("beta", 101, 0, abnormal=False, reason="stopped", by="supervisor")
    again = accepted(ms.register(ident("beta", 102, incarnation=1), TOKEN))
    assert again.rank == beta.rank == 1


def test_the_same_process_registering_twice_is_accepted_once() -> None:
    ms = make(worker_num=2)
    accepted(ms.register(ident("0", 100), TOKEN))
    accepted(ms.register(ident("0", 100), TOKEN))
    assert names(ms) == ["register"]


# ----------------------------------------------------------------- refusals
def test_wrong_token_is_refused_for_good() -> None:
    ms = make()
    result = refused(ms.register(ident("0", 100), "not-the-token"), RefuseReason.TOKEN)
    assert result.retry_after is None
    [(name, fields)] = ms.drain_events()
    assert (name, fields["reason"], fields["pid"]) == ("refuse", "token", 100)
    assert "secret" not in json.dumps(fields)


@pytest.mark.parametrize(("node_id", "rank"), [("4", None), ("0", 7), ("x", -1)])
def test_a_rank_beyond_worker_num_is_refused(node_id: str, rank: int | None) -> None:
    ms = make(worker_num=4)
    result = refused(ms.register(ident(node_id, 100, rank=rank), TOKEN),
                     RefuseReason.RANK_OUT_OF_RANGE)
    assert "worker_num=4" in result.message


def test_a_second_live_process_claiming_a_node_id_is_refused() -> None:
    ms = make()
    accepted(ms.register(ident("0", 100), TOKEN))
    result = refused(ms.register(ident("0", 999, incarnation=1), TOKEN), RefuseReason.DUPLICATE)
    assert "pid 100" in result.message and result.retry_after is not None


def test_a_rank_held_by_another_node_id_or_a_changed_rank_is_refused() -> None:
    ms = make(worker_num=3)
    accepted(ms.register(ident("alpha", 100, rank=2), TOKEN))
    refused(ms.register(ident("2", 101), TOKEN), RefuseReason.RANK_TAKEN)
    ms.report_exit("alpha", 100, 0, abnormal=False, reason="stopped", by="supervisor")
    refused(ms.register(ident("alpha", 102, incarnation=1, rank=1), TOKEN),
            RefuseReason.RANK_MISMATCH)


def test_a_refusal_is_one_event_per_process_and_reason_not_one_per_retry() -> None:
    ms = make()
    accepted(ms.register(ident("0", 100), TOKEN))
    ms.drain_events()
    for _ in range(5):
        refused(ms.register(ident("0", 999), TOKEN), RefuseReason.DUPLICATE)
    refused(ms.register(ident("0", 998), TOKEN), RefuseReason.DUPLICATE)
    assert names(ms) == ["refuse", "refuse"]


# ----------------------------------------------------------------- cooldown
def test_an_abnormal_exit_starts_the_cooldown_which_refuses_then_accepts() -> None:
    clock = FakeClock()
    ms = make(clock=clock, cooldown=30.0)
    join_all(ms, {"0": 100, "1": 101})
    ms.drain_events()
    until = ms.report_exit("1", 101, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    assert until == T0 + 30.0 and ms.cooldown_left("1") == 30.0
    leave_fields = dict(ms.drain_events())
    assert leave_fields["cooldown"]["until"] == T0 + 30.0
    assert leave_fields["leave"]["state"] == "dead"
    clock.advance(12.5)
    result = refused(ms.register(ident("1", 102, incarnation=1), TOKEN), RefuseReason.COOLDOWN)
    assert result.retry_after == pytest.approx(17.5) and "17.5s" in result.message
    [(name, fields)] = ms.drain_events()
    assert (name, fields["left"]) == ("refuse", pytest.approx(17.5))
    clock.advance(17.5)
    assert accepted(ms.register(ident("1", 102, incarnation=1), TOKEN)).generation == 1
    assert names(ms) == ["register", "generation", "membership"]


def test_a_cooldown_of_zero_lets_a_dead_node_back_at_once() -> None:
    ms = make(cooldown=0.0)
    join_all(ms, {"0": 100, "1": 101})
    assert ms.report_exit("1", 101, 0, abnormal=True, reason="exit 1", by="supervisor") == T0
    accepted(ms.register(ident("1", 102, incarnation=1), TOKEN))


def test_a_stopped_worker_has_no_cooldown_and_a_crash_before_registering_has_one() -> None:
    ms = make()
    join_all(ms, {"0": 100, "1": 101})
    assert ms.report_exit("0", 100, 0, abnormal=False, reason="SIGTERM", by="supervisor") == 0.0
    accepted(ms.register(ident("0", 110, incarnation=1), TOKEN))
    ms.report_exit("3", 555, 0, abnormal=True, reason="import error", by="supervisor")
    assert ms.cooldown_left("3") == 30.0


def test_an_exit_report_about_another_process_than_the_holder_is_ignored() -> None:
    ms = make()
    join_all(ms, {"0": 100, "1": 101})
    ms.report_exit("1", 999, 7, abnormal=True, reason="?", by="supervisor")
    assert ms.members["1"].state is MemberState.ALIVE and ms.cooldown_left("1") == 0.0


def test_every_reply_says_when_the_newest_fault_was_heard_of_and_a_reload_keeps_it() -> None:
    """What a recovery is timed from (recovery/train/elastic.py), with no history read."""
    clock = FakeClock()
    ms = make(clock=clock, cooldown=0.0)
    join_all(ms, {"0": 100, "1": 101})
    assert accepted(ms.heartbeat(ident("0", 100), TOKEN, global_step=1)).fault_at is None
    clock.advance(3.0)
    ms.report_exit("1", 101, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    clock.advance(2.0)
    assert accepted(ms.register(ident("1", 102, incarnation=1), TOKEN)).fault_at == T0 + 3.0
    reply = accepted(ms.heartbeat(ident("0", 100), TOKEN, global_step=2)).to_json()
    assert reply["fault_at"] == T0 + 3.0
    clock.advance(6.0)  # rank 0's beats stop: a heartbeat verdict is a fault too
    accepted(ms.heartbeat(ident("1", 102, incarnation=1), TOKEN, global_step=2))
    ms.check()
    assert ms.verdicts() == {0: "heartbeat"} and ms.fault_at == T0 + 11.0
    fresh, problem = reloaded(ms, clock)
    assert problem is None and fresh.fault_at == T0 + 11.0


# ----------------------------------------------------------------- heartbeats and hangs
def test_silence_past_the_heartbeat_timeout_is_a_heartbeat_verdict_and_fences_the_process() -> None:
    clock = FakeClock()
    ms = make(clock=clock)
    join_all(ms, {"0": 100, "1": 101})
    ms.drain_events()
    clock.advance(4.0)
    accepted(ms.heartbeat(ident("0", 100), TOKEN, global_step=1))
    clock.advance(2.0)
    ms.check()
    assert ms.verdicts() == {1: "heartbeat"} and not ms.complete
    events = dict(ms.drain_events())
    assert events["verdict"]["verdict"] == "heartbeat" and events["verdict"]["silent_s"] == 6.0
    assert events["cooldown"]["until"] == clock.wall + 30.0
    refused(ms.heartbeat(ident("1", 101), TOKEN, global_step=1), RefuseReason.STALE)
    ms.report_exit("1", 101, 0, abnormal=True, reason="killed after verdict", by="supervisor")
    assert ms.verdicts() == {} and ms.members["1"].state is MemberState.DEAD


def test_a_worker_behind_the_others_for_the_progress_timeout_is_hung() -> None:
    clock = FakeClock()
    ms = make(worker_num=3, clock=clock)
    join_all(ms, {"0": 100, "1": 101, "2": 102})
    for node, pid in (("0", 100), ("1", 101), ("2", 102)):
        ms.heartbeat(ident(node, pid), TOKEN, global_step=3)
    for _ in range(6):  # behind from 4.5 s on: more than 20 s at 27 s
        clock.advance(4.5)
        for node, pid, step in (("0", 100, 4), ("1", 101, 3), ("2", 102, 4)):
            accepted(ms.heartbeat(ident(node, pid), TOKEN, global_step=step))
        ms.check()
    assert ms.verdicts() == {1: "progress"}
    verdict = [f for n, f in ms.drain_events() if n == "verdict"][0]
    assert (verdict["rank"], verdict["step"], verdict["others_step"]) == (1, 3, 4)
    accepted(ms.heartbeat(ident("1", 101), TOKEN, global_step=4))
    assert ms.verdicts() == {} and ms.members["1"].state is MemberState.ALIVE


def test_everyone_stalled_at_the_same_step_is_not_a_hang() -> None:
    clock = FakeClock()
    ms = make(clock=clock)
    join_all(ms, {"0": 100, "1": 101})
    for _ in range(10):
        clock.advance(4.0)
        for node, pid in (("0", 100), ("1", 101)):
            ms.heartbeat(ident(node, pid), TOKEN, global_step=7)
        ms.check()
    assert ms.verdicts() == {}


# ----------------------------------------------------------------- ends
def test_the_job_is_finished_when_every_worker_finished() -> None:
    ms = make()
    join_all(ms, {"0": 100, "1": 101})
    ms.report_exit("0", 100, 0, abnormal=False, reason="finished", by="worker", finished=True)
    assert not ms.all_finished and ms.missing_ranks() == [] and ms.incomplete_for() == 0.0
    ms.report_exit("1", 101, 0, abnormal=False, reason="finished", by="worker", finished=True)
    assert ms.all_finished


def test_incomplete_for_counts_from_when_a_worker_went_missing() -> None:
    clock = FakeClock()
    ms = make(clock=clock)
    clock.advance(3.0)
    assert ms.incomplete_for() == 3.0
    join_all(ms, {"0": 100, "1": 101})
    assert ms.incomplete_for() == 0.0
    ms.report_exit("1", 101, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    clock.advance(2.0)
    assert ms.incomplete_for() == 2.0


def test_an_illegal_transition_raises() -> None:
    member = Member("0", 0, 100, 0, "h", MemberState.DEAD)
    with pytest.raises(IllegalTransition):
        member.transition(MemberState.HUNG)


# ----------------------------------------------------------------- persistence
def reloaded(ms: Membership, clock: FakeClock, **overrides: Any) -> tuple[Membership, str | None]:
    fresh = make(clock=clock, **overrides)
    return fresh, fresh.load(json.loads(json.dumps(ms.to_json())))


def test_a_reloaded_state_keeps_ranks_generation_and_cooldowns_and_waits_for_heartbeats() -> None:
    clock = FakeClock()
    ms = make(worker_num=3, clock=clock)
    join_all(ms, {"0": 100, "1": 101, "2": 102})
    ms.heartbeat(ident("0", 100), TOKEN, global_step=9)
    ms.report_exit("2", 102, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    clock.advance(1.0)
    again, problem = reloaded(ms, clock, worker_num=3)
    assert problem is None
    assert again.generation == 0 and again.cooldown_left("2") == 29.0
    assert {n: m.state for n, m in again.members.items()} == {
        "0": MemberState.UNCONFIRMED, "1": MemberState.UNCONFIRMED, "2": MemberState.DEAD}
    assert again.members["0"].global_step == 9
    clock.advance(3.0)
    accepted(again.heartbeat(ident("0", 100), TOKEN, global_step=10))
    assert names(again) == ["attach"]
    clock.advance(3.0)
    again.check()
    assert again.verdicts() == {1: "heartbeat"}


def test_a_reloaded_scheduler_forms_no_new_generation_for_the_same_processes() -> None:
    clock = FakeClock()
    ms = make(clock=clock)
    join_all(ms, {"0": 100, "1": 101})
    again, _ = reloaded(ms, clock)
    for node, pid in (("0", 100), ("1", 101)):
        assert accepted(again.heartbeat(ident(node, pid), TOKEN, global_step=1)).generation == 0
    assert names(again) == ["attach", "attach"] and again.generation == 0


def test_a_new_process_may_replace_an_unconfirmed_member_and_fences_the_old_one() -> None:
    clock = FakeClock()
    ms = make(clock=clock)
    join_all(ms, {"0": 100, "1": 101})
    again, _ = reloaded(ms, clock)
    accepted(again.register(ident("1", 201, incarnation=1), TOKEN))
    refused(again.heartbeat(ident("1", 101), TOKEN, global_step=3), RefuseReason.STALE)


def test_workers_reattach_to_a_scheduler_that_lost_its_state() -> None:
    ms = make()
    result = accepted(ms.heartbeat(ident("1", 101, rank=1), TOKEN, global_step=5))
    assert result.rank == 1
    assert names(ms) == ["attach"]


@pytest.mark.parametrize(("overrides", "why"), [({"worker_num": 3}, "worker_num"),
                                                 ({"token": "other"}, "token")])
def test_a_state_of_another_job_is_not_loaded(overrides: dict[str, Any], why: str) -> None:
    clock = FakeClock()
    ms = make(clock=clock)
    join_all(ms, {"0": 100})
    _, problem = reloaded(ms, clock, **overrides)
    assert problem is not None and why in problem


def test_a_malformed_state_is_not_loaded_and_changes_nothing() -> None:
    ms = make()
    data = make().to_json()
    data["members"] = [{"node_id": "0"}]
    assert "malformed" in (ms.load(data) or "")
    assert ms.members == {} and ms.generation == -1


# ----------------------------------------------------------------- hang verdicts in a generation
TICK = 0.5
"""How often the simulated workers heartbeat (seconds of the fake clock)."""


@dataclass
class Process:
    """One simulated worker process: what its heartbeat thread would send."""

    node_id: str
    incarnation: int
    joined_at: float
    step: int | None = None  # what ``report_step`` set last
    sent: int | None = None  # the step its last beat carried
    changed_at: float | None = None  # when a beat last carried a new step
    stopped: bool = False  # SIGSTOP: no beats
    gone: bool = False  # killed after a verdict

    @property
    def identity(self) -> Identity:
        return ident(self.node_id, 1000 * self.incarnation + int(self.node_id), self.incarnation)


class Cluster:
    """Workers heartbeating every TICK and a supervisor that kills a worker on a verdict,
    around the membership rules, as tftrun runs them. Records every verdict, and when
    the current generation formed and which members reported a new step since."""

    def __init__(self, worker_num: int, progress_timeout: float = 5.0) -> None:
        self.clock = FakeClock()
        self.ms = make(worker_num=worker_num, cooldown=0.0, clock=self.clock,
                       progress_timeout=progress_timeout)
        self.timeout = progress_timeout
        self.procs: dict[str, Process] = {}
        self.verdicts: list[tuple[Any, ...]] = []
        self.formed_at: float | None = None
        self.reported_in_generation: set[str] = set()
        self.checks: list[Callable[[Cluster, dict[str, Any]], None]] = []

    def join(self, *nodes: str) -> None:
        """Start (or relaunch) the process of each node; it registers at once."""
        for node in nodes:
            old = self.procs.get(node)
            if old is not None and not old.gone:
                continue
            proc = Process(node, 0 if old is None else old.incarnation + 1, self.clock.mono)
            self.procs[node] = proc
            accepted(self.ms.register(proc.identity, TOKEN))
            self._after_request()

    def report(self, **steps: int) -> None:
        """``report_step``: the new step goes out with the next beat."""
        for node, step in steps.items():
            self.procs[node].step = step

    def stop(self, node: str) -> None:
        self.procs[node].stopped = True

    def restart_scheduler(self) -> None:
        """kill -9 of the scheduler: a new one takes over the persisted state."""
        fresh = make(worker_num=self.ms.worker_num, cooldown=0.0, clock=self.clock,
                     progress_timeout=self.timeout)
        assert fresh.load(json.loads(json.dumps(self.ms.to_json()))) is None
        self.ms = fresh

    def wait(self, seconds: float) -> None:
        for _ in range(round(seconds / TICK)):
            self.clock.advance(TICK)
            for proc in sorted(self.procs.values(), key=lambda p: p.node_id):
                if not proc.gone and not proc.stopped:
                    self._beat(proc)
            self._after_request()  # the scheduler's ticker

    def _beat(self, proc: Process) -> None:
        accepted(self.ms.heartbeat(proc.identity, TOKEN, proc.step))
        if proc.step is not None and proc.step != proc.sent:
            proc.sent, proc.changed_at = proc.step, self.clock.mono
            self.reported_in_generation.add(proc.node_id)
        self._after_request()

    def _after_request(self) -> None:
        """What the scheduler does after each request, then the supervisor's kills."""
        self.ms.check()
        for name, fields in self.ms.drain_events():
            if name == "generation":
                self.formed_at = self.clock.mono
                self.reported_in_generation = set()
            elif name == "verdict":
                for check in self.checks:
                    check(self, fields)
                self.verdicts.append((fields["rank"], fields["verdict"]) if
                                     fields["verdict"] == "heartbeat" else
                                     (fields["rank"], "progress", fields["step"],
                                      fields["others_step"]))
        for rank in self.ms.verdicts():
            proc = self.procs[str(rank)]
            proc.gone = True
            self.ms.report_exit(proc.node_id, proc.identity.pid, proc.incarnation,
                                abnormal=True, reason="killed after a verdict", by="supervisor")


def run_scenario(worker_num: int, script: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    cluster = Cluster(worker_num)
    for action, *args in script:
        if action == "report":
            cluster.report(**args[0])
        else:
            getattr(cluster, action)(*args)
    return cluster.verdicts


HANG_SCENARIOS = {
    # issue 13: both timeouts 5 s, SIGSTOP of rank 3. The survivors wait in the step's
    # collective; their last new step is from before the pause, but their stall is counted
    # from the generation the relaunched rank forms with them, not from then.
    "a SIGSTOPped rank is replaced and the survivors are not judged by their wait": (4, [
        ("join", "0", "1", "2", "3"), ("report", {"0": 116, "1": 116, "2": 116, "3": 116}),
        ("wait", 1.0), ("stop", "3"), ("wait", 7.0),
        ("join", "3"), ("wait", 1.0), ("report", {"3": 117}), ("wait", 0.5),
        ("report", {"0": 117, "1": 117, "2": 117}), ("wait", 2.0),
        ("report", {"0": 118, "1": 118, "2": 118, "3": 118}), ("wait", 6.0),
    ], [(3, "heartbeat")]),
    # The same with the relaunched rank slow to start (6 s to its first step): the survivors
    # wait for it in the collective without a new step, so nobody is behind anybody.
    "a relaunched rank slow to start is not judged while the others wait for it": (3, [
        ("join", "0", "1", "2"), ("report", {"0": 31, "1": 31, "2": 31}), ("wait", 1.0),
        ("stop", "2"), ("wait", 6.0), ("join", "2"), ("wait", 6.0), ("report", {"2": 31}),
        ("wait", 0.5), ("report", {"0": 32, "1": 32, "2": 32}), ("wait", 6.0),
    ], [(2, "heartbeat")]),
    # Seen in CI: the stopped rank had sent its share of step 32's all-reduce to rank 0
    # but not to rank 1, so rank 0 got one step ahead of rank 1 as rank 2 stopped. Rank 1
    # lags because of rank 2: while a member is silent or gone, nobody is judged by progress.
    "a survivor left one step behind by the stopped rank is not judged": (3, [
        ("join", "0", "1", "2"), ("report", {"0": 31, "1": 31, "2": 31}), ("wait", 1.0),
        ("stop", "2"), ("report", {"0": 32}), ("wait", 12.0), ("join", "2"), ("wait", 1.0),
        ("report", {"0": 32, "1": 32, "2": 32}), ("wait", 2.0),
    ], [(2, "heartbeat")]),
    # The same when rank 0's step is seen before the stopped rank's last beat has aged:
    # the progress clocks run out before the heartbeat timeout does.
    "a survivor behind before the stopped rank is found dead is not judged first": (3, [
        ("join", "0", "1", "2"), ("report", {"0": 31, "1": 31, "2": 31}), ("wait", 1.0),
        ("report", {"0": 32}), ("wait", 0.5), ("stop", "2"), ("wait", 12.0),
        ("join", "2"), ("wait", 1.0), ("report", {"0": 32, "1": 32, "2": 32}), ("wait", 2.0),
    ], [(2, "heartbeat")]),
    # After a rollback to step 120, a member's step 140 of the previous generation is not
    # "ahead": the ones that report 121 are not hung; the one that reports nothing in the
    # new generation for progress_timeout after they did is.
    "steps of a previous generation are not compared": (3, [
        ("join", "0", "1", "2"), ("report", {"0": 140, "1": 140, "2": 140}), ("wait", 1.0),
        ("stop", "2"), ("wait", 6.0), ("join", "2"), ("report", {"0": 121, "2": 121}),
        ("wait", 6.0),
    ], [(2, "heartbeat"), (1, "progress", None, 121)]),
    # A rank without a step yet is measured from the generation forming, not from its
    # registration while the others were still starting.
    # A scheduler restart forms no generation: what was reported in this one still counts,
    # and what was reported before it still does not.
    "a hung rank is still found after a scheduler restart": (2, [
        ("join", "0", "1"), ("report", {"0": 3, "1": 3}), ("wait", 1.0), ("report", {"0": 4}),
        ("wait", 1.0), ("restart_scheduler",), ("wait", 6.0),
    ], [(1, "progress", 3, 4)]),
    "steps of a previous generation stay out of it across a scheduler restart": (3, [
        ("join", "0", "1", "2"), ("report", {"0": 140, "1": 140, "2": 140}), ("wait", 1.0),
        ("stop", "2"), ("wait", 6.0), ("join", "2"), ("report", {"0": 121, "2": 121}),
        ("wait", 1.0), ("restart_scheduler",), ("wait", 6.0),
    ], [(2, "heartbeat"), (1, "progress", None, 121)]),
    "a rank without a step is not judged before progress_timeout after the generation": (2, [
        ("join", "0"), ("wait", 4.0), ("join", "1"), ("report", {"1": 1}), ("wait", 4.5),
        ("report", {"0": 1}), ("wait", 0.5), ("report", {"0": 2, "1": 2}), ("wait", 1.0),
    ], []),
    "a rank without a step is hung once another has been ahead for progress_timeout": (2, [
        ("join", "0"), ("wait", 4.0), ("join", "1"), ("report", {"1": 1}), ("wait", 6.0),
    ], [(0, "progress", None, 1)]),
    # All ranks take 6 s to their first step. Rank 0's beat is the first to carry one
    # (13: the others stepped with it); theirs, sent just before, still carry none.
    "a heartbeat one interval old is not evidence of a hang": (3, [
        ("join", "0", "1", "2"), ("wait", 6.0), ("report", {"0": 13, "1": 13, "2": 13}),
        ("wait", 3.0),
    ], []),
    "a script that reports no step is never hung": (2, [
        ("join", "0"), ("wait", 3.0), ("join", "1"), ("wait", 30.0),
    ], []),
    "a rank behind the others' step of this generation for progress_timeout is hung": (3, [
        ("join", "0", "1", "2"), ("report", {"0": 3, "1": 3, "2": 3}), ("wait", 1.0),
        ("report", {"0": 4, "2": 4}), ("wait", 6.0),
    ], [(1, "progress", 3, 4)]),
    "everyone stalled at the same step is not a hang": (3, [
        ("join", "0", "1", "2"), ("report", {"0": 7, "1": 7, "2": 7}), ("wait", 30.0),
    ], []),
}


@pytest.mark.parametrize(("worker_num", "script", "expected"), HANG_SCENARIOS.values(),
                         ids=HANG_SCENARIOS.keys())
def test_hang_verdicts(worker_num: int, script: list[tuple[Any, ...]],
                       expected: list[tuple[Any, ...]]) -> None:
    assert run_scenario(worker_num, script) == expected


def stalled_for_the_timeout(cluster: Cluster, verdict: dict[str, Any]) -> None:
    """A member judged hung had neither a new generation, nor its start, nor a new step of
    its own within progress_timeout."""
    if verdict["verdict"] != "progress":
        return
    proc = cluster.procs[verdict["node_id"]]
    assert cluster.formed_at is not None
    last = max(cluster.formed_at, proc.joined_at, proc.changed_at or 0.0)
    assert cluster.clock.mono - last > cluster.timeout, verdict


def others_progressed_in_this_generation(cluster: Cluster, verdict: dict[str, Any]) -> None:
    """A member is judged hung only when another member reported a new step since the
    generation formed."""
    if verdict["verdict"] == "progress":
        assert cluster.reported_in_generation - {verdict["node_id"]}, verdict


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, list[tuple[Any, ...]]]:
    """A worker count and what its workers do: join (or relaunch), report a step (one
    rank, or all in step), stop (SIGSTOP); the scheduler's restarts, and time passing."""
    worker_num = draw(st.integers(2, 4))
    node = st.sampled_from([str(rank) for rank in range(worker_num)])
    step = st.integers(0, 6)
    actions = draw(st.lists(st.one_of(
        st.tuples(st.just("join"), node),
        st.tuples(st.just("report"), node, step),
        st.tuples(st.just("report_all"), step),
        st.tuples(st.just("stop"), node),
        st.just(("restart_scheduler",)),
        st.tuples(st.just("wait"), st.sampled_from([0.5, 1.0, 2.0, 3.0, 5.0, 8.0])),
    ), max_size=30))
    return worker_num, actions


@settings(max_examples=200, deadline=None)
@given(scenario=scenarios())
def test_a_member_that_progressed_within_the_timeout_of_its_generation_is_never_hung(
        scenario: tuple[int, list[tuple[Any, ...]]]) -> None:
    worker_num, actions = scenario
    cluster = Cluster(worker_num)
    cluster.checks = [stalled_for_the_timeout, others_progressed_in_this_generation]
    for action, *args in actions:
        live = [n for n, p in cluster.procs.items() if not p.gone]
        if action == "report_all":
            cluster.report(**{n: args[0] for n in live})
        elif action == "report" and args[0] in live:
            cluster.report(**{args[0]: args[1]})
        elif action == "stop" and args[0] in live:
            cluster.stop(args[0])
        elif action in ("join", "wait", "restart_scheduler"):
            getattr(cluster, action)(*args)


# ----------------------------------------------------------------- liveness by signed time
def test_a_beat_counts_from_its_signed_stamp_read_against_the_senders_clock() -> None:
    """Silence is measured from when a member sent its beats (their signed stamps), not
    from when the scheduler got round to them; a host whose clock is far off is read
    against its own least delay, and is neither lost nor spared for that."""
    clock = FakeClock()
    ms = make(clock=clock)
    join_all(ms, {"0": 100, "1": 101})
    skew = -120.0  # node 1's clock is two minutes behind the scheduler's
    accepted(ms.heartbeat(ident("0", 100), TOKEN, 1, sent=clock.time()))
    accepted(ms.heartbeat(ident("1", 101), TOKEN, 1, sent=clock.time() + skew))
    clock.advance(3.0)
    sent_0, sent_1 = clock.time(), clock.time() + skew
    clock.advance(2.5)  # both beats waited 2.5 s in the queue
    accepted(ms.heartbeat(ident("0", 100), TOKEN, 2, sent=sent_0))
    accepted(ms.heartbeat(ident("1", 101), TOKEN, 2, sent=sent_1))
    clock.advance(2.6)  # 5.1 s since they were sent; 2.6 s since they were handled
    ms.check()
    assert {m.state for m in ms.members.values()} == {MemberState.LOST}


def test_a_late_first_beat_makes_a_member_look_fresher_never_staler() -> None:
    clock = FakeClock()
    ms = make(clock=clock)
    join_all(ms, {"0": 100, "1": 101})
    accepted(ms.heartbeat(ident("0", 100), TOKEN, 1, sent=clock.time() - 4.0))
    clock.advance(4.9)
    ms.check()
    assert ms.members["0"].state is MemberState.ALIVE
