"""Absent is not tampered (issue 38): a node's beat is life only when its count rises
(launcher/nodes/presence.py), a beat or join key that does not verify is an alert and
not an absence (launcher/nodes/link.py, with a real in-process TCPStore), and a round
waits up to its timeout for a node whose key was tampered with
(recovery/control/node_range.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed import TCPStore

from launcher.nodes.link import Beat, NodeKeys, NodeLink
from launcher.nodes.presence import BeatTracker
from recovery.control.node_range import NODE_SILENT, Close, NodeRange, RoundWait, close_round
from recovery.control.nodes import beat_key, join_key, stored_at
from recovery.control.signing import job_key

LAST_CALL, TIME_OUT = 30.0, 600.0


@settings(max_examples=300, deadline=None)
@given(counts=st.lists(st.integers(0, 50), min_size=1, max_size=30))
def test_a_replayed_or_repeated_count_is_never_life(counts: list[int]) -> None:
    """Whatever a stranger replays: node 1 is heard at read ``i`` exactly when its count
    is above every count read before; a count below the highest is told as a replay."""
    tracker = BeatTracker(range(1, 2), started=-1.0)
    for now, count in enumerate(counts):
        before = counts[:now]
        replayed = tracker.seen(NodeKeys({1: Beat(count)}), float(now))
        rose = not before or count > max(before)
        assert (tracker.silent_since(1) == now) is rose
        assert replayed == ([] if rose or count == max(before) else [(1, count, max(before))])
    assert tracker.silent_since(1) == counts.index(max(counts))


def test_a_node_joins_by_its_beat_only_while_it_beats() -> None:
    tracker = BeatTracker(range(1, 3), started=0.0)
    tracker.seen(NodeKeys({1: Beat(10, joining=4), 2: Beat(7)}, refused=frozenset({2})), 1.0)
    assert tracker.joining(4, 1.0) == {1} and tracker.joining(5, 1.0) == frozenset()
    assert tracker.joining(4, 1.0 + NODE_SILENT) == frozenset()  # silent since: not joining
    assert tracker.disputed() == {2}
    tracker.seen(NodeKeys({1: Beat(11), 2: Beat(8)}), 2.0)
    assert tracker.joining(4, 2.0) == frozenset() and tracker.disputed() == frozenset()


@st.composite
def ranges(draw: st.DrawFn) -> NodeRange:
    high = draw(st.integers(2, 6))
    return NodeRange(draw(st.integers(1, high - 1)), high)


@settings(max_examples=300, deadline=None)
@given(span=ranges(), data=st.data())
def test_a_round_closes_without_a_disputed_node_only_after_its_timeout(
        span: NodeRange, data: st.DataObject) -> None:
    nodes = list(range(span.high))
    joined = frozenset(data.draw(st.sets(st.sampled_from(nodes))) | {0})
    expected = frozenset(data.draw(st.sets(st.sampled_from(nodes))))
    disputed = frozenset(data.draw(st.sets(st.sampled_from(nodes), min_size=1)))
    opened = data.draw(st.floats(0, 100))
    now = opened + data.draw(st.floats(0, 2 * TIME_OUT))
    reached = None if len(joined) < span.low else data.draw(st.floats(opened, now))
    decision = close_round(RoundWait(joined, expected, opened, reached, disputed), span, now,
                           LAST_CALL, TIME_OUT)
    if isinstance(decision, Close) and not disputed <= set(decision.nodes):
        assert len(joined) == span.high or now - opened >= TIME_OUT


def test_a_disputed_node_holds_the_last_call_until_the_timeout() -> None:
    wait = RoundWait(frozenset({0}), frozenset({0}), 0.0, 0.0, disputed=frozenset({1}))
    assert not isinstance(close_round(wait, NodeRange(1, 3), LAST_CALL + 1, LAST_CALL, TIME_OUT),
                          Close)
    assert close_round(wait, NodeRange(1, 3), TIME_OUT, LAST_CALL, TIME_OUT) == Close((0,))
    both = RoundWait(frozenset({0, 1}), frozenset({0}), 0.0, 0.0, disputed=frozenset({1}))
    assert close_round(both, NodeRange(1, 3), 1.0, LAST_CALL, TIME_OUT) == Close((0, 1))


@pytest.fixture(scope="module")
def server() -> Any:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=5))


def test_a_tampered_beat_or_join_is_an_alert_not_an_absence(server: Any) -> None:
    """A stranger who lists the store overwrites node 1's beat and its join of restart 2:
    node 0 reads both as refused, and alerts (not reports) each key once."""
    reported: list[tuple[str, str, int]] = []
    alerted: list[tuple[str, str, int]] = []
    node_0, node_1 = (NodeLink("127.0.0.1", server.port, "the-secret", "run-alerts",
                               report=lambda *told: reported.append(told),
                               alert=lambda *told: alerted.append(told)) for _ in range(2))
    node_1.beat(1, Beat(5, joining=2))
    node_1.join_round(2, 1)
    key = job_key("the-secret", "run-alerts", "")
    for name in (beat_key(1), join_key(2, 1)):
        server.set(stored_at(key, name), b"\xff not yours")
    assert node_0.beats(range(1, 3)) == NodeKeys({}, refused=frozenset({1}))
    assert node_0.joined(2, range(3)) == NodeKeys({}, refused=frozenset({1}))
    node_0.alert(join_key(3, 1), "unset, while node 1's signed beat says it joined")
    assert [told[0] for told in alerted] == [beat_key(1), join_key(2, 1), join_key(3, 1)]
    assert reported == []
    node_1.beat(1, Beat(6))
    assert node_0.beats(range(1, 2)) == NodeKeys({1: Beat(6)})
