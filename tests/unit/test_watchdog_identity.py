"""The watchdog kills processes by identity (issue 26): a pid or a session id that the
kernel handed to another program, after the pid counter wrapped in a long job, is never
chosen. Pure decisions on /proc snapshots (a real process in a reused session:
tests/integration/test_watchdog_reused_session.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.procs.sessions import JobProcesses, ProcStat, Session


def stat(pid: int, session: int, starttime: int, ppid: int = 1) -> ProcStat:
    return ProcStat(pid, "S", ppid, session, starttime)


def test_a_session_forgotten_once_empty_is_not_swept_when_its_id_comes_back() -> None:
    job = JobProcesses()
    job.add(Session(100, 5_000))
    worker, loader = stat(100, 100, 5_000), stat(101, 100, 5_001, ppid=100)
    assert set(job.look([worker, loader])) == {worker, loader}
    assert job.look([]) == [] and job.sessions == []  # the session ended: forgotten
    # Months later the pid counter wrapped: another program leads a session of id 100.
    stranger, its_child = stat(100, 100, 9_000), stat(101, 100, 9_001, ppid=100)
    assert job.look([stranger, its_child]) == []


def test_a_pid_reused_while_its_session_is_followed_is_not_the_jobs() -> None:
    job = JobProcesses()
    job.add(Session(100, 5_000))
    worker, loader = stat(100, 100, 5_000), stat(205, 100, 5_001, ppid=100)
    job.look([worker, loader])
    # The loader ended and pid 205 now belongs to another user's tmux server.
    tmux = stat(205, 7_000, 9_000)
    assert job.look([worker, tmux]) == [worker]


def test_a_process_forked_since_the_last_look_is_the_jobs_through_its_parent() -> None:
    job = JobProcesses()
    job.add(Session(100, 5_000))
    worker = stat(100, 100, 5_000)
    job.look([worker])
    fresh, grandchild = stat(300, 100, 5_500, ppid=100), stat(301, 100, 5_501, ppid=300)
    assert set(job.look([worker, fresh, grandchild])) == {worker, fresh, grandchild}
    # Orphaned once its parent is killed, it is still known by its identity.
    assert set(job.look([stat(301, 100, 5_501, ppid=1)])) == {stat(301, 100, 5_501, ppid=1)}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(2, 40), st.integers(2, 40), st.integers(0, 50),
                          st.integers(1, 40)), max_size=30))
def test_a_process_never_known_and_not_descended_from_the_job_is_never_chosen(
        others: list[tuple[int, int, int, int]]) -> None:
    """Whatever else runs (any pids, sessions, start times, parents), the chosen ones
    are the job's worker (pid 1000), members of its session that started after it, and
    descendants of those only."""
    job = JobProcesses()
    job.add(Session(1000, 100))
    worker = stat(1000, 1000, 100)
    snapshot = [worker] + [stat(pid, sid, start, ppid) for pid, sid, start, ppid in others]
    chosen = job.look(snapshot)
    by_pid = {p.pid: p for p in snapshot}
    for process in chosen:
        chain = process
        while not (chain.session == 1000 and chain.starttime >= 100):
            chain = by_pid[chain.ppid]
    assert worker in chosen
