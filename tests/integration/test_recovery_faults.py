"""Recovery under harder faults: during a save, repeatedly, during the recovery itself, a
hung rank; and when per-rank relaunch cannot work, restart-all.

The per-rank tests run the main job (tests/support/mnist.py: 80 steps of 3 ranks, a
checkpoint every 20) under tftrun with the cooldown off, inject their faults at moments
read from ``events.jsonl`` and the workers' logs, and check that the job ends with every
rank's parameters bitwise equal to the fault-free run, with only the killed ranks started
again. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from recovery.ckpt.layout import checkpoint_name, rank_dir
from recovery.position import TrainPosition
from support import BIN, TFT_OFF, events, log_has, spawn, spawned_pids, terminate, tftrun_cmd, wait_for, wait_for_event
from support.mnist import EVENT, START, assert_recovered, mnist_job, wait_job

pytestmark = pytest.mark.timeout(240)



@contextmanager
def faulty_job(tmp_path: Path, port: int,
               *options: str) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """The main job under tftrun, in the background; stopped whatever the test does."""
    proc = spawn(mnist_job(tmp_path, "faulty", port, *options), env=TFT_OFF)
    try:
        yield proc, tmp_path / "faulty"
    finally:
        terminate(proc)


WINDOW = 4
"""Seconds of ``--rejoin_cooldown`` that hold a generation from forming after a fault."""


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def wait_recovered(log_dir: Path, generation: int | None = None) -> None:
    """Wait for rank 0 to report that the job recovered (in ``generation``, if given)."""
    match = {} if generation is None else {"generation": generation}
    wait_for_event(log_dir, EVENT, f"recovered in generation {generation}",
                   event="recovered", **match)


def test_rank_0_killed_during_a_checkpoint_save(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    """kill -9 of rank 0 while it writes its checkpoint of step 40.

    The save is caught in the act: rank 0's first write of that checkpoint stalls
    just after its temporary file is made (tests/bin/stalled_save.py), the test waits for
    the file (``.mnist-1_40.ckpt.<random>.<pid>.tmp``, recovery/ckpt/layout.py) and kills
    rank 0. That the kill landed inside the save is checked, not assumed: the temporary
    file is still there after the kill (a finished save renames it away), and the
    relaunched rank 0 removes it as a dead writer's leftover. The step-40 checkpoint then
    exists on ranks 1 and 2 only, so the newest common one is step 20.
    """
    name = checkpoint_name("mnist", TrainPosition(1, 40, 40))
    with faulty_job(tmp_path, free_port, str(BIN / "stalled_save.py"), "0", name) as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 0, "step=35 "), START, "rank 0 past step 35")
        first = spawned_pids(log_dir)
        pattern = f".{name}.*.{first[0]}.tmp"
        folder = rank_dir(tmp_path / "faulty_recovery", 0)
        [temp] = wait_for(lambda: list(folder.glob(pattern)), EVENT, f"{pattern} being written")
        kill(first[0])
        assert temp.exists(), "the kill came after the save had finished"
        wait_recovered(log_dir)
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
        wait_for(lambda: log_has(log_dir, 0, "step=30 "), START, "rank 0 past step 30")
        first = spawned_pids(log_dir)
        for generation, victim in enumerate(victims, start=1):
            lines = (log_dir / "worker_0.log").read_text().count("step=")
            kill(spawned_pids(log_dir)[victim])
            wait_recovered(log_dir, generation)
            wait_for(lambda lines=lines: (log_dir / "worker_0.log").read_text().count("step=")
                     >= lines + 2, EVENT, "training going on")
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, victims, mnist_reference)
    assert [e["generation"] for e in events(log_dir, "generation")] == [0, 1, 2, 3]
    assert [e["generation"] for e in events(log_dir, "recovered")] == [1, 2, 3]
    assert [e["rank"] for e in events(log_dir, "fault")] == victims


@pytest.mark.parametrize("moment", [
    "spawn",
    "register",
])
def test_the_relaunched_rank_killed_again_while_it_rejoins(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str], moment: str) -> None:
    """Rank 2 is killed, and its replacement is killed too as soon as its ``spawn`` (it is
    still starting Python) or its ``register`` event (it joins the next generation)
    appears; the third process of rank 2 brings the job to its end.

    A replacement killed after it met its generation's members but before it connected
    leaves them in the rendezvous for up to the heartbeat timeout (recovery/runtime/group.py):
    10 s here rather than the default 30 s, whichever way the race goes."""
    with faulty_job(tmp_path, free_port, "--heartbeat_timeout=10") as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 2, "step=30 "), START, "rank 2 past step 30")
        first = spawned_pids(log_dir)
        kill(first[2])
        relaunched = wait_for_event(log_dir, EVENT, "rank 2 relaunched", event="spawn",
                                    role="worker", rank=2, incarnation=1)
        if moment == "register":
            wait_for_event(log_dir, EVENT, "its registration", event="register",
                           pid=relaunched["pid"])
        assert not events(log_dir, "recovered")
        kill(relaunched["pid"])
        wait_recovered(log_dir)
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, [2, 2], mnist_reference)
    assert [e["rank"] for e in events(log_dir, "fault")] == [2, 2]


def test_two_ranks_killed_at_once(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    with faulty_job(tmp_path, free_port) as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 0, "step=30 "), START, "rank 0 past step 30")
        first = spawned_pids(log_dir)
        kill(first[1])
        kill(first[2])
        wait_recovered(log_dir)
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, [1, 2], mnist_reference)
    assert sorted(e["rank"] for e in events(log_dir, "fault")) == [1, 2]
    [recovered] = events(log_dir, "recovered")
    assert recovered["generation"] == 1


def test_a_survivor_killed_while_the_group_re_forms(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    """Rank 2 dies; rank 0, a survivor, is killed after the ``fault`` of rank 2 and
    before the next generation is formed: rank 2's replacement waits out a 4 s cooldown
    (without one, a relaunch forked warm registers within milliseconds of the fault, and
    the next generation was seen formed before the kill)."""
    with faulty_job(tmp_path, free_port, f"--rejoin_cooldown={WINDOW}") as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 0, "step=30 "), START, "rank 0 past step 30")
        first = spawned_pids(log_dir)
        kill(first[2])
        wait_for_event(log_dir, EVENT, "the fault of rank 2", event="fault", rank=2)
        assert not [e for e in events(log_dir, "generation") if e["generation"] > 0]
        kill(first[0])
        wait_recovered(log_dir)
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, [2, 0], mnist_reference)
    assert [e["generation"] for e in events(log_dir, "recovered")] == [1]


def test_the_scheduler_killed_in_the_middle_of_a_recovery(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    """kill -9 of the scheduler after rank 2's ``fault`` and before the new generation:
    tftrun relaunches it, it reloads its state, rank 2's replacement registers with it
    and the survivors re-attach; the recovery completes. Rank 2's replacement waits out a
    4 s cooldown, which holds the next generation from forming before the kill."""
    with faulty_job(tmp_path, free_port, f"--rejoin_cooldown={WINDOW}") as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 0, "step=30 "), START, "rank 0 past step 30")
        first = spawned_pids(log_dir)
        scheduler = spawned_pids(log_dir, "scheduler")[None]
        kill(first[2])
        wait_for_event(log_dir, EVENT, "the fault of rank 2", event="fault", rank=2)
        assert not [e for e in events(log_dir, "generation") if e["generation"] > 0]
        kill(scheduler)
        wait_recovered(log_dir)
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, [2], mnist_reference)
    # Rank 2's relaunch comes before the scheduler's when its exit report was answered
    # before the kill, after it when the report is delivered to the relaunched scheduler.
    assert sorted(e["what"] for e in events(log_dir, "restart")) == ["rank", "scheduler"]
    assert [e["reloaded"] for e in events(log_dir, "scheduler_start")] == [False, True]
    assert [e["generation"] for e in events(log_dir, "recovered")] == [1]


def test_a_hung_rank_is_declared_dead_and_replaced(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    """SIGSTOP of rank 1: no heartbeat for ``--heartbeat_timeout``, so the scheduler
    declares it dead, tftrun kills it (``hang``) and relaunches it; the job rolls back."""
    with faulty_job(tmp_path, free_port, "--heartbeat_timeout=3") as (proc, log_dir):
        wait_for(lambda: log_has(log_dir, 1, "step=30 "), START, "rank 1 past step 30")
        first = spawned_pids(log_dir)
        os.kill(first[1], signal.SIGSTOP)
        wait_recovered(log_dir)
        output = wait_job(proc)
    assert proc.returncode == 0, output
    assert_recovered(log_dir, first, [1], mnist_reference)
    [verdict] = events(log_dir, "verdict")
    assert (verdict["rank"], verdict["verdict"], verdict["pid"]) == (1, "heartbeat", first[1])
    [hang] = events(log_dir, "hang")
    assert (hang["rank"], hang["reason"], hang["pid"]) == (1, "heartbeat", first[1])
    [fault] = events(log_dir, "fault")
    assert (fault["rank"], fault["cause"]) == (1, "hang")


def test_a_plain_torchrun_script_falls_back_to_restart_all(tmp_path: Path, free_port: int) -> None:
    """A script that never calls ``recovery.init()`` cannot rejoin a running group: under
    the default ``--restart_policy=auto`` a kill -9 of one rank restarts every rank (new
    pids all), and the script resumes from its own checkpoint, as under torchrun."""
    log_dir, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    ckpt.mkdir()
    proc = spawn(tftrun_cmd("--worker_num=3", f"--log_dir={log_dir}", f"--master_port={free_port}",
                            "--grace_period=5", str(BIN / "plain_resumable.py"), "60", str(ckpt)),
                 env=TFT_OFF)
    try:
        wait_for(lambda: log_has(log_dir, 1, "step=5"), START, "rank 1 at step 5")
        first = spawned_pids(log_dir)
        kill(first[1])
        output = wait_job(proc)
    finally:
        terminate(proc)
    assert proc.returncode == 0, output
    died = [e for e in events(log_dir, "exit") if e["pid"] == first[1]]
    assert died and died[0]["signal"] == "SIGKILL" and died[0]["expected"] is False
    assert [(e["rank"], e["cause"]) for e in events(log_dir, "fault")] == [(1, "SIGKILL")]
    restarts = events(log_dir, "restart")
    assert [(r["what"], r["restart_count"], r["ranks"]) for r in restarts] == [
        ("workers", 1, [0, 1, 2])]
    second = [e for e in events(log_dir, "spawn")
              if e["role"] == "worker" and e["restart_count"] == 1]
    assert sorted(e["rank"] for e in second) == [0, 1, 2]
    assert all(e["incarnation"] == 1 for e in second)
    assert not {e["pid"] for e in second} & set(first.values())  # every pid changed
    for rank in range(3):
        log = (log_dir / f"worker_{rank}.log").read_text()
        resumed = [int(line.split("=")[1]) for line in log.splitlines()
                   if line.startswith("resumed from step=")]
        assert len(resumed) == 1 and resumed[0] >= 5
        assert "done value=" in log


@pytest.mark.parametrize("max_restarts", [1, 0])
def test_a_rank_that_dies_after_every_other_finished_is_not_relaunched_alone(
        tmp_path: Path, free_port: int, max_restarts: int) -> None:
    """Ranks 0 and 2 finish (exit 0); rank 1 lingers after the final step and is killed.
    Relaunched alone it would wait for peers that are gone until ``--cluster_time_out``
    (600 s by default): instead, as it had reached its peers' final step, its death is a
    crash in its teardown: the job ends at once with status 0 and a ``teardown_crash``
    warning, nothing relaunched or restarted, whatever the budget."""
    log_dir = tmp_path / "logs"
    proc = spawn(tftrun_cmd("--worker_num=3", f"--log_dir={log_dir}", f"--master_port={free_port}",
                            f"--recovery_path={tmp_path / 'recovery'}", "--rejoin_cooldown=0",
                            f"--max_restarts={max_restarts}", "--grace_period=5",
                            str(BIN / "sched_train.py"), "--steps", "5", "--linger-rank", "1"),
                 env=TFT_OFF)
    try:
        for rank in (0, 2):
            wait_for_event(log_dir, EVENT, f"rank {rank} finished", event="exit", role="worker",
                           rank=rank, exitcode=0)
        wait_for(lambda: log_has(log_dir, 1, "rank 1 lingers"), EVENT, "rank 1 lingering")
        first = spawned_pids(log_dir)
        kill(first[1])
        output = wait_job(proc)  # far below the default cluster_time_out
    finally:
        terminate(proc)
    assert proc.returncode == 0, output
    assert not events(log_dir, "restart")
    [crash] = events(log_dir, "teardown_crash")
    assert (crash["rank"], crash["cause"], crash["step"], crash["final_step"]) == (
        1, "SIGKILL", 5, 5)
    assert "teardown" in events(log_dir, "job_end")[-1]["reason"]
