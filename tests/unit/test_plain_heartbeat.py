"""A rank's heartbeat in a node's beat, decided at once (``Membership.plain_heartbeat``):
whatever it decides must be what the full ``heartbeat`` decides, to the last field."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.control.members import Identity, MemberState
from recovery.control.membership import Membership
from recovery.timeouts import Timeouts
from support.fake_clock import FakeClock
from support.membership import TOKEN, ident

RANKS = 4
NODE = "host-a/0"


def make() -> tuple[Membership, FakeClock]:
    clock = FakeClock()
    timeouts = Timeouts(rejoin_cooldown=1.0, cluster_time_out=600.0, heartbeat_timeout=5.0,
                        progress_timeout=8.0)
    return Membership(RANKS, TOKEN, timeouts, clock, min_worker_num=2), clock


def beat(identity: Identity, step: int | None, phase: str | None, ready: bool | None,
         age_ms: int) -> dict[str, Any]:
    """A ``node_beat``'s rank, as recovery/control/requests.py hands it on."""
    return {"op": "heartbeat", "node_id": identity.node_id, "pid": identity.pid,
            "incarnation": identity.incarnation, "host": identity.host, "rank": identity.rank,
            "step": step, "phase": phase, "ready": ready, "age": age_ms}


def state(ms: Membership) -> list[tuple[Any, ...]]:
    """Everything the rules keep of each member, the clocks included."""
    return [(m.to_json(), m.heartbeat_at, m.progress_at, m.behind_since, m.least_delay, m.via)
            for m in ms.members.values()]


STEPS = st.lists(st.tuples(
    st.sampled_from(["beat", "beat", "beat", "stale_pid", "register", "die", "time", "check"]),
    st.integers(0, RANKS - 1),
    st.one_of(st.none(), st.integers(0, 30)),  # step
    st.sampled_from([None, "train", "save"]),  # phase
    st.sampled_from([None, True, False]),  # ready
    st.sampled_from([0, 1200, 4999, 5000, 5001, 9000]),  # age, ms
    st.floats(-2.0, 2.0)),  # the beat's stamp against the clock
    max_size=40)


@settings(max_examples=200, deadline=None)
@given(STEPS)
def test_the_quick_answer_to_a_beat_is_the_full_answer(steps: list[tuple[Any, ...]]) -> None:
    quick, clock = make()
    full, full_clock = make()
    pids = {r: 100 + r for r in range(RANKS)}
    for ms in (quick, full):
        for rank in range(RANKS):
            ms.register(ident(str(rank), pids[rank], rank=rank), TOKEN, via=NODE)
    gap = quick.facts_version - full.facts_version  # each count starts at random
    for op, rank, step, phase, ready, age, skew in steps:
        identity = ident(str(rank), pids[rank] + (op == "stale_pid"), rank=rank)
        if op in ("beat", "stale_pid"):
            sent = clock.time() + skew - age / 1000
            plain = quick.plain_heartbeat(beat(identity, step, phase, ready, age), sent, NODE)
            answer = plain if plain is not None else quick.heartbeat(
                identity, TOKEN, step, phase, sent=sent, ready=ready, via=NODE,
                silent=age / 1000)
            expected = full.heartbeat(identity, TOKEN, step, phase, sent=sent, ready=ready,
                                      via=NODE, silent=age / 1000)
            assert answer.to_json() == expected.to_json()
        else:
            for ms, its_clock in ((quick, clock), (full, full_clock)):
                if op == "register":
                    its_clock.advance(2.0)
                    ms.register(ident(str(rank), pids[rank] + 1000, rank=rank), TOKEN, via=NODE)
                elif op == "die":
                    ms.report_exit(str(rank), pids[rank], 0, abnormal=True, reason="kill",
                                   by="supervisor")
                elif op == "time":
                    its_clock.advance(3.0)
                else:
                    ms.check()
            if op == "register":
                pids[rank] += 1000
        assert state(quick) == state(full)
        assert quick.drain_events() == full.drain_events()
        assert quick.generation == full.generation
        assert quick.facts_version - full.facts_version == gap  # they move together


def test_only_a_plain_beat_is_decided_at_once() -> None:
    ms, _clock = make()
    for rank in range(RANKS):
        ms.register(ident(str(rank), 100 + rank, rank=rank), TOKEN, via=NODE)
    alive = ident("1", 101, rank=1)
    assert ms.members["1"].state is MemberState.ALIVE
    assert ms.plain_heartbeat(beat(alive, 3, "train", None, 0), None, NODE) is not None
    assert ms.members["1"].global_step == 3 and ms.members["1"].phase == "train"
    # Left to the full rules: another process, a rank silent past the timeout, a rank
    # that says it is ready anew, a rank the scheduler does not know.
    assert ms.plain_heartbeat(beat(ident("1", 999, rank=1), 4, None, None, 0), None, NODE) is None
    assert ms.plain_heartbeat(beat(alive, 4, None, None, 5001), None, NODE) is None
    ms.members["1"].ready = False
    assert ms.plain_heartbeat(beat(alive, 4, None, True, 0), None, NODE) is None
    assert ms.plain_heartbeat(beat(ident("9", 1, rank=9), 4, None, None, 0), None, NODE) is None
    assert ms.members["1"].global_step == 3  # none of them took the step
