"""The elastic node range's rules (``--nnodes=MIN:MAX``): when a round closes and with
which nodes (recovery/control/node_range.py), and when a change of nodes restarts the
group or ends the job (launcher/supervisor/policy.py, on node 0).

The state machine plays a job's nodes against both: nodes are lost (they stop beating),
arrive or come back, time passes; every restart the policy decides is carried out by
closing a round with the nodes there. After each step: a generation never has fewer than
MIN nodes nor more than MAX, its ranks are 0 … W − 1, node by node in node rank order,
and each change of nodes seen costs exactly one restart.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from launcher.supervisor.actions import EXIT_PEER_ENDED, RestartAll, Stop
from launcher.supervisor.job_view import JobView, RankView
from launcher.supervisor.policy import decide
from launcher.supervisor.state import WorkerState
from recovery.control.node_range import (
    Close,
    MembershipWhy,
    NodeRange,
    Round,
    RoundWait,
    TooFew,
    Wait,
    close_round,
    membership_why,
)

LAST_CALL, TIME_OUT = 30.0, 600.0


@st.composite
def ranges(draw: st.DrawFn) -> NodeRange:
    high = draw(st.integers(2, 6))
    return NodeRange(draw(st.integers(1, high - 1)), high)


@settings(max_examples=300, deadline=None)
@given(span=ranges(), data=st.data())
def test_a_round_closes_within_the_range_with_nodes_that_joined(span: NodeRange,
                                                                data: st.DataObject) -> None:
    nodes = list(range(span.high))
    joined = frozenset(data.draw(st.sets(st.sampled_from(nodes))) | {0})
    expected = frozenset(data.draw(st.sets(st.sampled_from(nodes))))
    opened = data.draw(st.floats(0, 100))
    now = opened + data.draw(st.floats(0, 2 * TIME_OUT))
    reached = None if len(joined) < span.low else data.draw(st.floats(opened, now))
    decision = close_round(RoundWait(joined, expected, opened, reached), span, now,
                           LAST_CALL, TIME_OUT)
    if isinstance(decision, Close):
        assert span.low <= len(decision.nodes) <= span.high
        assert set(decision.nodes) <= joined and list(decision.nodes) == sorted(decision.nodes)
        assert len(joined) == span.high or expected <= joined or now - reached >= LAST_CALL
    elif isinstance(decision, TooFew):
        assert len(joined) < span.low and now - opened >= TIME_OUT
        assert f"--nnodes={span.low}:{span.high}" in decision.reason
    else:
        assert isinstance(decision, Wait) and decision.until > now
        assert len(joined) < span.high and not (len(joined) >= span.low and expected <= joined)


@given(nodes=st.sets(st.integers(0, 20), min_size=1), nproc=st.integers(1, 8),
       generation=st.integers(0, 50))
def test_a_rounds_ranks_are_contiguous_node_by_node(nodes: set[int], nproc: int,
                                                     generation: int) -> None:
    shape = Round(generation, tuple(sorted(nodes)))
    seats = [range(shape.first_rank(node, nproc), shape.first_rank(node, nproc) + nproc)
             for node in shape.nodes]
    assert [rank for seat in seats for rank in seat] == shape.active(nproc)
    assert shape.active(nproc) == list(range(shape.world(nproc)))


def test_a_round_refuses_nodes_out_of_order() -> None:
    with pytest.raises(ValueError, match="ascending"):
        Round(0, (1, 0))


def test_the_why_of_a_change_names_what_changed() -> None:
    assert membership_why(None, (0, 1)) is MembershipWhy.START
    assert membership_why((), (0, 1)) is MembershipWhy.START
    assert membership_why((0, 1), (0,)) is MembershipWhy.SHRINK
    assert membership_why((0,), (0, 1)) is MembershipWhy.GROW
    assert membership_why((0, 1), (0, 2)) is MembershipWhy.REPLACE
    assert membership_why((0, 1), (1, 0)) is MembershipWhy.REPLACE


NPROC = 2


class ElasticNodes(RuleBasedStateMachine):
    """Node 0 of an elastic job: the other nodes beat or fall silent, arrive and leave;
    node 0's policy restarts the group, and each restart closes a round."""

    @initialize(span=ranges())
    def start(self, span: NodeRange) -> None:
        self.span = span
        self.now = 0.0
        self.beating = set(range(span.high))
        self.silent_since: dict[int, float] = {}
        self.waiting: set[int] = set()
        self.restart_count = 0
        self.nodes = tuple(range(span.high))
        self.restarts = 0
        self.changes = 0
        self.ended = False

    def _view(self) -> JobView:
        ranks = tuple(RankView(rank, WorkerState.RUNNING) for rank in range(NPROC))
        return JobView(ranks, max_restarts=0, node_rank=0, node_time_out=TIME_OUT,
                       node_range=self.span, round_nodes=self.nodes,
                       waiting_nodes=frozenset(self.waiting),
                       silent_since={node: self.silent_since.get(node, self.now)
                                     for node in self.nodes if node != 0})

    @precondition(lambda self: not self.ended)
    @rule(data=st.data())
    def a_node_falls_silent(self, data: st.DataObject) -> None:
        others = sorted(self.beating - {0})
        if others:
            node = data.draw(st.sampled_from(others))
            self.beating.discard(node)
            self.silent_since[node] = self.now

    @precondition(lambda self: not self.ended)
    @rule(data=st.data())
    def a_node_arrives(self, data: st.DataObject) -> None:
        node = data.draw(st.integers(1, self.span.high - 1))
        self.beating.add(node)
        self.silent_since.pop(node, None)
        if node not in self.nodes:
            self.waiting.add(node)

    @rule(dt=st.sampled_from([1.0, TIME_OUT / 2, TIME_OUT]))
    def time_passes(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: not self.ended)
    @rule()
    def node_0_decides(self) -> None:
        actions = decide(self._view(), self.now)
        restarts = [a for a in actions if isinstance(a, RestartAll)]
        ends = [a for a in actions if isinstance(a, Stop)]
        assert len(restarts) <= 1 and not (restarts and ends)
        lost = [n for n in self.nodes if n in self.silent_since
                and self.now - self.silent_since[n] >= TIME_OUT]
        joining = set(self.waiting) - set(self.nodes)
        if ends:
            [end] = ends
            assert end.status == EXIT_PEER_ENDED and end.everywhere
            assert len(self.nodes) - len(lost) < self.span.low  # only below MIN
            self.ended = True
            return
        changed = bool(lost) or (bool(joining) and len(self.nodes) < self.span.high)
        assert bool(restarts) == changed  # one restart for each change, none without
        if restarts:
            assert not restarts[0].charged
            self._restart()
            if not self.ended:  # the change was taken: it restarts nothing again
                assert not any(isinstance(a, RestartAll) for a in decide(self._view(), self.now))

    def _restart(self) -> None:
        """The restart's round: every beating node of the job joins; it closes at once
        (MAX, or all the live ones joined), or below MIN waits out its time-out."""
        self.restarts += 1
        self.restart_count += 1
        joined = frozenset(self.beating | {0})
        reached = self.now if len(joined) >= self.span.low else None
        opened = self.now
        while isinstance(decision := close_round(RoundWait(joined, joined, opened, reached),
                                                 self.span, self.now, LAST_CALL, TIME_OUT),
                         Wait):
            assert reached is None  # only below MIN does a round wait for the live nodes
            self.now = decision.until
        if isinstance(decision, TooFew):
            self.ended = True
            return
        before, self.nodes = self.nodes, decision.nodes
        self.waiting.clear()  # the next round's joins are yet to come
        self.changes += set(before) != set(self.nodes)

    @invariant()
    def a_generation_stays_in_the_range_with_contiguous_ranks(self) -> None:
        if self.ended:
            return
        assert self.span.low <= len(self.nodes) <= self.span.high
        assert 0 in self.nodes
        shape = Round(self.restart_count, self.nodes)
        assert shape.active(NPROC) == list(range(len(self.nodes) * NPROC))

    @invariant()
    def no_change_without_a_restart(self) -> None:
        # A restart may find no change: the node that asked to join fell silent first.
        assert self.changes <= self.restarts


TestElasticNodes = ElasticNodes.TestCase
TestElasticNodes.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
