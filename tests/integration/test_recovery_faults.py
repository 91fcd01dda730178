"""Per-rank recovery under harder faults: during a save, repeatedly, during the recovery itself.

Each test runs the main job (tests/support_mnist.py: 125 steps of 3 ranks, a checkpoint
every 20) under tftrun with the cooldown off, injects its faults at moments read from
``events.jsonl`` and the workers' logs, and checks that the job ends with every rank's
parameters bitwise equal to the fault-free run, with only the killed ranks started again.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support import events, log_has, spawn, spawned_pids, terminate, wait_for, wait_for_event
from support_mnist import TFT_OFF, final_digests, mnist_job

from recovery.layout import checkpoint_name, rank_dir

pytestmark = pytest.mark.timeout(240)

JOB_END = 150
"""Seconds a faulty job may take to end (a fault-free one takes about 12 s alone)."""
EVENT = 60
"""Seconds to wait for one event of a recovery."""


@contextmanager
def faulty_job(tmp_path: Path, port: int, *options: str) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """The main job under tftrun, in the background; stopped whatever the test does."""
    proc = spawn(mnist_job(tmp_path, "faulty", port, *options), env=TFT_OFF)
    try:
        yield proc, tmp_path / "faulty"
    finally:
        terminate(proc)


def wait_job(proc: subprocess.Popen[str]) -> str:
    """Wait for tftrun to end; return its output (to show when an assertion fails)."""
    stdout, stderr = proc.communicate(timeout=JOB_END)
    return stdout + stderr


def worker_launches(log_dir: Path) -> list[tuple[int, int]]:
    """(rank, pid) of every worker process tftrun started, in order."""
    return [(e["rank"], e["pid"]) for e in events(log_dir, "spawn") if e["role"] == "worker"]


def assert_recovered(log_dir: Path, first: dict[int, int], killed: list[int],
                     reference: dict[int, str]) -> None:
    """Only the ``killed`` ranks were started again (each once more per kill), the other
    ranks kept their first process, and every rank ended bitwise equal to ``reference``."""
    launches = worker_launches(log_dir)
    for rank, pid in first.items():
        pids = [p for r, p in launches if r == rank]
        assert pids[0] == pid
        assert len(pids) == 1 + killed.count(rank), (rank, pids)
        assert len(set(pids)) == len(pids)
    assert not any(e["what"] == "workers" for e in events(log_dir, "restart"))
    assert final_digests(log_dir) == reference
    assert events(log_dir, "job_end")[-1]["exitcode"] == 0


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def test_rank_0_killed_during_a_checkpoint_save(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    """kill -9 of rank 0 while it writes its checkpoint of step 40.

    The save is caught in the act: once rank 0 is near step 40, the test polls its
    checkpoint folder without pause for the temporary file of that checkpoint
    (``.mnist-1_40.ckpt.<pid>.tmp``, recovery/layout.py) and kills rank 0 the moment it
    appears. That the kill landed inside the save is checked, not assumed: the temporary
    file is still there after the kill (a finished save renames it away), and the
    relaunched rank 0 removes it as a dead writer's leftover. The step-40 checkpoint then
    exists on ranks 1 and 2 only, so the newest common one is step 20.
    """
    with faulty_job(tmp_path, free_port) as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 0, "step=35 "), EVENT, "rank 0 past step 35")
        first = spawned_pids(log_dir)
        temp = (rank_dir(tmp_path / "faulty_recovery", 0)
                / f".{checkpoint_name('mnist', 1, 40)}.{first[0]}.tmp")
        wait_for(temp.exists, EVENT, f"{temp.name} being written", interval=0)
        kill(first[0])
        assert temp.exists(), "the kill came after the save had finished"
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, [0], mnist_reference)
    assert log_has(log_dir, 0, f"removed {temp}, left by writer {first[0]}")
    [rollback] = events(log_dir, "rollback")
    assert rollback["step"] == 20


def test_three_kills_of_different_ranks_one_after_another(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    """Ranks 1, 2, then 0 are killed, each once the previous recovery is over and
    training went on for a few steps: three rollbacks in three new generations."""
    victims = [1, 2, 0]
    with faulty_job(tmp_path, free_port, "--max_restarts=3") as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 0, "step=30 "), EVENT, "rank 0 past step 30")
        first = spawned_pids(log_dir)
        for generation, victim in enumerate(victims, start=1):
            lines = (log_dir / "worker_0.log").read_text().count("step=")
            kill(spawned_pids(log_dir)[victim])
            wait_for_event(log_dir, EVENT, f"recovery {generation}", event="recovered",
                           generation=generation)
            wait_for(lambda lines=lines: (log_dir / "worker_0.log").read_text().count("step=")
                     >= lines + 2, EVENT, "training going on")
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, victims, mnist_reference)
    assert [e["generation"] for e in events(log_dir, "generation")] == [0, 1, 2, 3]
    assert [e["generation"] for e in events(log_dir, "recovered")] == [1, 2, 3]
    assert [e["rank"] for e in events(log_dir, "fault")] == victims


@pytest.mark.parametrize("moment", ["spawn", "register"])
def test_the_relaunched_rank_killed_again_while_it_rejoins(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str], moment: str) -> None:
    """Rank 2 is killed, and its replacement is killed too as soon as its ``spawn`` (it is
    still starting Python) or its ``register`` event (it joins the next generation)
    appears; the third process of rank 2 brings the job to its end."""
    with faulty_job(tmp_path, free_port) as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 2, "step=30 "), EVENT, "rank 2 past step 30")
        first = spawned_pids(log_dir)
        kill(first[2])
        relaunched = wait_for_event(log_dir, EVENT, "rank 2 relaunched", event="spawn",
                                    role="worker", rank=2, incarnation=1)
        if moment == "register":
            wait_for_event(log_dir, EVENT, "its registration", event="register",
                           pid=relaunched["pid"])
        assert not events(log_dir, "recovered")
        kill(relaunched["pid"])
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, [2, 2], mnist_reference)
    assert [e["rank"] for e in events(log_dir, "fault")] == [2, 2]


def test_two_ranks_killed_at_once(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    with faulty_job(tmp_path, free_port) as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 0, "step=30 "), EVENT, "rank 0 past step 30")
        first = spawned_pids(log_dir)
        kill(first[1])
        kill(first[2])
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, [1, 2], mnist_reference)
    assert sorted(e["rank"] for e in events(log_dir, "fault")) == [1, 2]
    [recovered] = events(log_dir, "recovered")
    assert recovered["generation"] == 1


def test_a_survivor_killed_while_the_group_re_forms(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    """Rank 2 dies; rank 0, a survivor, is killed after the ``fault`` of rank 2 and
    before the next generation is formed (rank 2's replacement is still starting)."""
    with faulty_job(tmp_path, free_port) as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 0, "step=30 "), EVENT, "rank 0 past step 30")
        first = spawned_pids(log_dir)
        kill(first[2])
        wait_for_event(log_dir, EVENT, "the fault of rank 2", event="fault", rank=2)
        assert not [e for e in events(log_dir, "generation") if e["generation"] > 0]
        kill(first[0])
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, [2, 0], mnist_reference)
    assert [e["generation"] for e in events(log_dir, "recovered")] == [1]


def test_the_scheduler_killed_in_the_middle_of_a_recovery(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    """kill -9 of the scheduler after rank 2's ``fault`` and before the new generation:
    tftrun relaunches it, it reloads its state, rank 2's replacement registers with it
    and the survivors re-attach; the recovery completes."""
    with faulty_job(tmp_path, free_port) as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 0, "step=30 "), EVENT, "rank 0 past step 30")
        first = spawned_pids(log_dir)
        scheduler = spawned_pids(log_dir, "scheduler")[None]
        kill(first[2])
        wait_for_event(log_dir, EVENT, "the fault of rank 2", event="fault", rank=2)
        assert not [e for e in events(log_dir, "generation") if e["generation"] > 0]
        kill(scheduler)
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, [2], mnist_reference)
    assert [e["what"] for e in events(log_dir, "restart")] == ["rank", "scheduler"]
    assert [e["reloaded"] for e in events(log_dir, "scheduler_start")] == [False, True]
    assert [e["generation"] for e in events(log_dir, "recovered")] == [1]


def test_a_hung_rank_is_declared_dead_and_replaced(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    """SIGSTOP of rank 1: no heartbeat for ``--heartbeat_timeout``, so the scheduler
    declares it dead, tftrun kills it (``hang``) and relaunches it; the job rolls back."""
    with faulty_job(tmp_path, free_port, "--heartbeat_timeout=3") as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 1, "step=30 "), EVENT, "rank 1 past step 30")
        first = spawned_pids(log_dir)
        os.kill(first[1], signal.SIGSTOP)
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, [1], mnist_reference)
    [verdict] = events(log_dir, "verdict")
    assert (verdict["rank"], verdict["verdict"], verdict["pid"]) == (1, "heartbeat", first[1])
    [hang] = events(log_dir, "hang")
    assert (hang["rank"], hang["reason"], hang["pid"]) == (1, "heartbeat", first[1])
    [fault] = events(log_dir, "fault")
    assert (fault["rank"], fault["cause"]) == (1, "hang")
