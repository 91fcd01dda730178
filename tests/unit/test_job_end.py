"""The job's end on every node (launcher/nodes/job_end.py): what another node makes of
node 0's word, and whom node 0 waits for before it stops its store."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from launcher.nodes.job_end import DONE_GRACE, STILL, Over, done_line, heard, parse_over, waiting_for
from launcher.supervisor.actions import Stop, StopWorkers
from launcher.supervisor.job_view import JobView, RankView
from launcher.supervisor.policy import decide
from launcher.supervisor.state import WorkerState


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


def test_another_nodes_running_workers_get_the_grace_to_end_by_themselves_then_are_stopped() -> None:
    line = done_line(1, Over(0, "all workers succeeded"))

    def view(*states: WorkerState) -> JobView:
        return JobView(tuple(RankView(rank, state) for rank, state in enumerate(states, 2)),
                       max_restarts=0, node_rank=1, peer_done=line, peer_done_at=10.0)

    running = view(WorkerState.RUNNING, WorkerState.RUNNING)
    assert not any(isinstance(a, Stop) for a in decide(running, 10.0 + DONE_GRACE - 0.1))
    [stop, stop_workers] = decide(running, 10.0 + DONE_GRACE)
    assert stop == Stop(0, line) and isinstance(stop_workers, StopWorkers), stop_workers
    assert decide(view(WorkerState.SUCCEEDED, WorkerState.SUCCEEDED), 10.0) == [Stop(0, "all workers succeeded")]
    assert decide(view(WorkerState.SUCCEEDED, WorkerState.FAILED), 10.0)[0] == Stop(0, line)
