"""The job's end on every node (launcher/nodes/job_end.py): what another node makes of
node 0's word, and whom node 0 waits for before it stops its store."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from launcher.nodes.job_end import STILL, Over, done_line, heard, parse_over, waiting_for


def test_node_0s_word_reads_back_and_anything_else_is_nothing() -> None:
    over = Over(0, "all workers succeeded")
    assert parse_over(over.value()) == over
    for text in (None, "", "0", "[]", '{"status": "x", "reason": "r"}', '{"reason": "r"}'):
        assert parse_over(text) is None, text


def test_a_job_that_ended_well_ends_another_node_with_a_line_and_a_failed_one_as_a_peer_end() -> None:
    assert heard(None, 1) == ("", "")
    assert heard(Over(0, "all workers succeeded"), 1) == (
        "the job ended on node 0 (exit 0: all workers succeeded): node 1 has nothing left to run", "")
    assert heard(Over(1, "rank 0 failed"), 2) == ("", "node 0: rank 0 failed")
    assert done_line(3, Over(0, "x")).startswith("the job ended on node 0")


@given(left=st.frozensets(st.integers(1, 5)), still=st.lists(st.floats(0, 10), min_size=5, max_size=5),
       now=st.floats(0, 10))
def test_node_0_waits_exactly_for_the_nodes_that_beat_and_have_not_left(
        left: frozenset[int], still: list[float], now: float) -> None:
    nodes = range(1, 6)
    since = dict(zip(nodes, still))
    waited = waiting_for(nodes, left, since, now)
    for node in nodes:
        assert (node in waited) == (node not in left and now - since[node] < STILL)
