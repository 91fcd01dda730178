"""The supervisor's view of the other nodes, read from its node's status (``status`` with
a scope): what it asks for, and the answers the policy gets from it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from launcher.config import LaunchConfig
from launcher.supervisor.job_view import RETIRED_VERDICT
from launcher.supervisor.observer import Observer, watch_scope
from launcher.supervisor.state import Worker
from launcher.supervisor.watch import SNAPSHOT_INTERVAL, STATUS_RATE, SchedulerWatch, Scope, snapshot_interval
from recovery.control.membership import Membership
from recovery.control.stragglers import Straggler
from recovery.timeouts import Timeouts
from support.fake_clock import FakeClock
from support.membership import TOKEN, ident, join_all

RANKS = 8


class Control:
    """The scheduler, in process: answers a node's status from a :class:`Membership`."""

    def __init__(self, membership: Membership) -> None:
        self.membership = membership
        self.asked: list[tuple[int, int, bool]] = []

    def node_status(self, first_rank: int, nproc: int, missing: bool) -> dict[str, Any]:
        self.asked.append((first_rank, nproc, missing))
        return {"ok": True, **self.membership.node_status(first_rank, nproc, missing)}


def config(tmp_path: Path, node_rank: int) -> LaunchConfig:
    return LaunchConfig(script=tmp_path / "train.py", worker_num=RANKS, local_worker_num=4,
                        node_rank=node_rank, master_addr="10.0.0.1", node_addr="10.0.0.2")


def observed(cfg: LaunchConfig, control: Control) -> Observer:
    """An observer that has read one snapshot of ``control``."""
    woken = threading.Event()
    watch = SchedulerWatch(control, None, woken.set, watch_scope(cfg))  # type: ignore[arg-type]
    watch.start()
    try:
        assert woken.wait(10)
    finally:
        watch.close()
    observer = Observer(cfg, watch, None)
    observer.read(0.0, [])
    return observer


def test_each_node_asks_for_its_own_ranks_and_node_0_of_several_for_the_missing_ones(
        tmp_path: Path) -> None:
    assert watch_scope(config(tmp_path, 1)) == Scope(range(4, 8), missing=False)
    assert watch_scope(config(tmp_path, 0)) == Scope(range(0, 4), missing=True)
    one_node = LaunchConfig(script=tmp_path / "train.py", worker_num=RANKS)
    assert watch_scope(one_node) == Scope(range(0, RANKS), missing=False)


def test_a_node_sees_the_other_nodes_train_then_finish_from_their_counts(
        tmp_path: Path) -> None:
    timeouts = Timeouts(rejoin_cooldown=1.0, cluster_time_out=600.0, heartbeat_timeout=5.0)
    membership = Membership(RANKS, TOKEN, timeouts, FakeClock())
    for rank in range(RANKS):
        membership.register(ident(str(rank), 100 + rank), TOKEN)
    control = Control(membership)
    cfg = config(tmp_path, 1)
    observer = observed(cfg, control)
    assert control.asked[0] == (4, 4, False)
    assert [m.rank for m in observer.snapshot.members] == [4, 5, 6, 7]
    assert observer.others_training() == (4, frozenset())
    assert observer.others_finished() == (False, None)
    for rank, step in [(0, 10), (1, 12), (2, 11)]:
        membership.heartbeat(ident(str(rank), 100 + rank), TOKEN, step)
        membership.report_exit(str(rank), 100 + rank, 0, abnormal=False, reason="done",
                               by="worker", finished=True)
    membership.report_exit("3", 103, 0, abnormal=True, reason="SIGKILL", by="supervisor")
    membership.retire([3], "lost")
    observer = observed(cfg, control)
    assert observer.others_training() == (3, frozenset({3}))
    assert observer.others_finished() == (True, 12)


def test_snapshots_are_spaced_in_large_jobs_only_and_news_takes_one_at_once() -> None:
    assert snapshot_interval(1) == snapshot_interval(128) == SNAPSHOT_INTERVAL
    assert snapshot_interval(1024) == 1024 / STATUS_RATE
    timeouts = Timeouts(rejoin_cooldown=1.0, cluster_time_out=600.0, heartbeat_timeout=5.0)
    control = Control(Membership(RANKS, TOKEN, timeouts, FakeClock()))
    woken = threading.Semaphore(0)
    watch = SchedulerWatch(control, None, woken.release, Scope(range(0, 4)),  # type: ignore[arg-type]
                           interval=3600.0)
    watch.start()
    try:
        assert not woken.acquire(timeout=0.3)  # nothing until the interval, or news
        watch.poke()
        assert woken.acquire(timeout=10)
    finally:
        watch.close()
    assert control.asked == [(0, 4, False)]


def test_a_large_job_asks_for_its_status_only_when_its_beats_say_something_changed() -> None:
    """Spaced snapshots (a job of more than 128 nodes): a round asks only when the count of
    changes a beat's reply brought differs from the last snapshot's."""
    timeouts = Timeouts(rejoin_cooldown=1.0, cluster_time_out=600.0, heartbeat_timeout=5.0)
    membership = Membership(RANKS, TOKEN, timeouts, FakeClock())
    control = Control(membership)
    rounds = threading.Semaphore(0)
    watch = SchedulerWatch(control, None, rounds.release, Scope(range(0, 4)),  # type: ignore[arg-type]
                           interval=SNAPSHOT_INTERVAL + 0.1)
    watch.start()
    try:
        assert rounds.acquire(timeout=10)  # the first round: no snapshot yet, so it asks
        assert watch.snapshot is not None and watch.snapshot.facts == membership.facts_version
        watch.facts_heard(membership.facts_version)
        for _round in range(3):
            assert rounds.acquire(timeout=10)
        assert len(control.asked) == 1  # three rounds, nothing new: nothing asked
        membership.register(ident("1", 101), TOKEN)
        watch.facts_heard(membership.facts_version)  # the next beat's reply
        assert rounds.acquire(timeout=10)
        assert len(control.asked) == 2
        assert [m.rank for m in watch.snapshot.members] == [1]
    finally:
        watch.close()


def test_a_small_job_asks_every_round_whatever_its_beats_say() -> None:
    timeouts = Timeouts(rejoin_cooldown=1.0, cluster_time_out=600.0, heartbeat_timeout=5.0)
    membership = Membership(RANKS, TOKEN, timeouts, FakeClock())
    control = Control(membership)
    rounds = threading.Semaphore(0)
    watch = SchedulerWatch(control, None, rounds.release, Scope(range(0, 4)),  # type: ignore[arg-type]
                           interval=0.05)
    watch.start()
    try:
        assert rounds.acquire(timeout=10)
        watch.facts_heard(membership.facts_version)
        for _round in range(3):
            assert rounds.acquire(timeout=10)
    finally:
        watch.close()
    assert len(control.asked) >= 4



class _Process:
    """What the observer reads of a worker's child: its pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid


def _running(rank: int, pid: int) -> Worker:
    worker = Worker(rank=rank, local_rank=rank % 4)
    worker.launched(_Process(pid))  # type: ignore[arg-type]
    return worker


@pytest.mark.parametrize(("min_worker_num", "verdict"), [(6, RETIRED_VERDICT), (8, "heartbeat")])
def test_a_rank_the_scheduler_retired_as_it_judged_it_gets_the_retired_verdict(
        tmp_path: Path, min_worker_num: int, verdict: str) -> None:
    """Node 1's rank 5, evicted as a straggler again at its relaunch's first measured step:
    retired at once while 6 ranks may train without it, else only judged lost; the
    verdict counts for the process the scheduler judged only."""
    timeouts = Timeouts(rejoin_cooldown=1.0, cluster_time_out=600.0, heartbeat_timeout=5.0)
    membership = Membership(RANKS, TOKEN, timeouts, FakeClock(), min_worker_num)
    join_all(membership, {str(rank): 100 + rank for rank in range(RANKS)})
    assert membership.evict_straggler(membership.members["5"], Straggler(5, 0.3, 0.1, 40), 40, 20)
    observer = observed(config(tmp_path, 1), Control(membership))
    workers = [_running(rank, 100 + rank) for rank in range(4, 8)]
    assert observer.verdicts(workers) == {5: verdict}
    assert observer.verdicts([_running(5, 999)]) == {}


def test_a_rank_that_called_a_restartable_function_is_relaunched_without_a_cooldown(
        tmp_path: Path) -> None:
    """Its peers wait for it (``@recovery.restartable`` trains in whole generations only):
    the relaunch is due at its failure; another rank's after ``--rejoin_cooldown``."""
    import json
    import os
    from types import SimpleNamespace

    from launcher.procs.process import Child
    from launcher.supervisor.state import Failure

    cfg = LaunchConfig(script=tmp_path / "train.py", worker_num=2)
    events = tmp_path / "events.jsonl"
    pid = os.getpid()
    events.write_text(json.dumps({"ts": 1.0, "event": "function_call", "rank": 0, "pid": pid,
                                  "call": 1}) + "\n")
    watch = SchedulerWatch(Control(Membership(2, TOKEN, Timeouts(), FakeClock())), None,
                           lambda: None, watch_scope(cfg))  # type: ignore[arg-type]
    observer = Observer(cfg, watch, events)
    workers = [Worker(rank=rank, local_rank=rank) for rank in (0, 1)]
    for worker in workers:
        worker.child = Child(SimpleNamespace(pid=pid))  # type: ignore[arg-type]
    observer.read(100.0, [workers[0]])
    for worker in workers:
        worker.failure = Failure(worker.rank, pid, 0, 100.0, -9, "killed", "SIGKILL", 137)
    assert observer.cooldown_until(workers[0]) == 100.0
    assert observer.cooldown_until(workers[1]) == 100.0 + cfg.rejoin_cooldown > 100.0
