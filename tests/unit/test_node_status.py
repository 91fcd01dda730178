"""A node's status (``status`` with a scope): its own ranks' rows and the job's facts,
which must say what the whole table says, whatever happened to the members since the
facts were found (they are kept between questions)."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from recovery.control.members import LIVE_STATES, MemberState
from recovery.control.membership import Membership
from recovery.timeouts import Timeouts
from support.fake_clock import FakeClock
from support.membership import TOKEN, ident

RANKS = 8
LIVE = {state.value for state in LIVE_STATES}
FINISHED = MemberState.FINISHED.value


def make(clock: FakeClock) -> Membership:
    timeouts = Timeouts(rejoin_cooldown=1.0, cluster_time_out=600.0, heartbeat_timeout=5.0)
    return Membership(RANKS, TOKEN, timeouts, clock, min_worker_num=2)


def from_the_table(table: dict[str, Any], own: range) -> dict[str, Any]:
    """What a node's status must hold, found in the whole table as the supervisor's
    observer found it before it asked for its node's status only."""
    members = table["members"]
    retired = set(table["retired"])
    others = [m for m in members if m["rank"] not in own]
    finished = [m for m in others if m["state"] == FINISHED]
    steps = [m["step"] for m in finished if m["step"] is not None]
    held = {m["rank"] for m in members if m["state"] in LIVE or m["state"] == FINISHED}
    missing = sorted(set(range(RANKS)) - held - retired)  # found from the rows, not the facts
    assert table["missing"] == missing
    return {"members": [m for m in members if m["rank"] in own], "retired": table["retired"],
            "missing": missing,
            "missing_known": [r for r in missing if r in {m["rank"] for m in members}],
            "others": {
                "training": len({m["rank"] for m in others if m["rank"] not in retired
                                 and (m["state"] in LIVE or m["state"] == FINISHED)}),
                "finished": len({m["rank"] for m in finished} | (retired - set(own))),
                "finished_step": max(steps, default=None)}}


def scoped(ms: Membership, own: range) -> dict[str, Any]:
    status = ms.node_status(own.start, len(own), missing=True)
    assert status["scope"] == {"first_rank": own.start, "nproc": len(own)}
    return {key: status[key] for key in ("members", "retired", "missing", "missing_known",
                                         "others")}


class Job:
    """A membership of :data:`RANKS` registered ranks, and what a test may do to it."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.ms = make(self.clock)
        self.pids = {r: 100 + r for r in range(RANKS)}
        for rank in range(RANKS):
            self.ms.register(ident(str(rank), self.pids[rank]), TOKEN)

    def apply(self, op: str, rank: int, step: int) -> None:
        ms, node, pid = self.ms, str(rank), self.pids[rank]
        if op == "register":
            self.clock.advance(2.0)  # past the cooldown
            self.pids[rank] = pid = pid + 100
            ms.register(ident(node, pid), TOKEN, ready=step % 3 != 0)
        elif op == "ready":
            ms.heartbeat(ident(node, pid), TOKEN, None, ready=True)
        elif op == "step":
            ms.heartbeat(ident(node, pid), TOKEN, step, phase=f"phase {step}")
        elif op in ("finish", "die", "leave"):
            ms.report_exit(node, pid, 0, abnormal=op == "die", reason=op, by="supervisor",
                           finished=op == "finish")
        elif op == "retire":
            ms.retire([rank], "test")
        else:
            self.clock.advance(6.0)
            ms.check()


OPS = st.lists(st.tuples(st.sampled_from(["register", "ready", "step", "finish", "die",
                                          "leave", "retire", "silence"]),
                         st.integers(0, RANKS - 1), st.integers(0, 50)),
               max_size=40)


@settings(max_examples=150, deadline=None)
@given(OPS, st.integers(0, RANKS - 1), st.integers(1, RANKS))
def test_a_node_status_says_what_the_whole_table_says(ops: list[tuple[str, int, int]],
                                                      first: int, nproc: int) -> None:
    job = Job()
    own = range(first, min(RANKS, first + nproc))
    for op, rank, step in ops:
        scoped(job.ms, own)  # the facts are kept from here: each change must renew them
        job.apply(op, rank, step)
        table = job.ms.status()
        assert scoped(job.ms, own) == from_the_table(table, own)
        assert job.ms.all_finished == (  # kept between changes too
            sum(m["state"] == FINISHED for m in table["members"]) == RANKS)


def test_a_node_status_of_a_quiet_job_holds_its_own_rows_only() -> None:
    clock = FakeClock()
    ms = make(clock)
    for rank in range(RANKS):
        ms.register(ident(str(rank), 100 + rank), TOKEN)
    status = ms.node_status(4, 4, missing=False)
    assert [m["rank"] for m in status["members"]] == [4, 5, 6, 7]
    assert status["others"] == {"training": 4, "finished": 0, "finished_step": None}
    assert status["retired"] == [] and "missing" not in status
    assert status["generation"] == ms.generation and status["worker_num"] == RANKS


_MOVING = ("step", "generation_step", "phase", "heartbeat_age", "cooldown_left")
"""What a row shows that moves without the count of changes: steps and phases (the node's
events file has them), and the times left, which run down."""


def shown(ms: Membership, own: range) -> dict[str, Any]:
    """What a node's snapshot tells its supervisor, but for what moves on its own."""
    status = ms.node_status(own.start, len(own), missing=True)
    return {**{key: status[key] for key in ("generation", "retired", "missing",
                                           "missing_known", "others")},
            "members": [{k: v for k, v in row.items() if k not in _MOVING}
                        for row in status["members"]],
            "cooldowns": dict(ms.cooldowns)}


@settings(max_examples=150, deadline=None)
@example([("finish", 3, 0), ("register", 3, 0), ("ready", 3, 0)], 0, 4)  # found in CI
@given(OPS, st.integers(0, RANKS - 1), st.integers(1, RANKS))
def test_whatever_a_node_status_shows_anew_comes_with_a_new_count_of_changes(
        ops: list[tuple[str, int, int]], first: int, nproc: int) -> None:
    """A large job's supervisor asks for its status only when its beat's reply says the
    count of changes moved: a change it would not ask about must never be one it needs."""
    job = Job()
    own = range(first, min(RANKS, first + nproc))
    for op, rank, step in ops:
        before, count = shown(job.ms, own), job.ms.facts_version
        job.apply(op, rank, step)
        if shown(job.ms, own) != before:
            assert job.ms.facts_version != count, f"{op} {rank} changed the status unannounced"


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_the_rules_leave_no_generation_unformed(ops: list[tuple[str, int, int]]) -> None:
    """The periodic rules work out whether the job is whole only after a change of the
    count (it is O(members)): once they ran, working it out again decides nothing."""
    job = Job()
    for op, rank, step in ops:
        job.apply(op, rank, step)
        job.ms.check()
        generation, events = job.ms.generation, job.ms.drain_events()
        job.ms._update_completeness()  # noqa: SLF001 - what check() may have skipped
        assert (job.ms.generation, job.ms.drain_events()) == (generation, []), (op, rank, events)


def test_a_beat_with_nothing_new_leaves_the_count_of_changes_where_it_was() -> None:
    ms = make(FakeClock())
    for rank in range(RANKS):
        ms.register(ident(str(rank), 100 + rank), TOKEN)
    count = ms.facts_version
    for step in range(3):
        for rank in range(RANKS):
            assert ms.heartbeat(ident(str(rank), 100 + rank), TOKEN, step, "train").to_json()["ok"]
    assert ms.facts_version == count
