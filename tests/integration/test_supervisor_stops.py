"""The supervisor always stops in order (issue 13, deliverable 4), with real processes.

* a relaunch waiting in COOLDOWN when the group must restart (it crashed the loop with
  ``illegal move cooldown -> cooldown``);
* a rank that crashes in its teardown just before its peers exit 0 (it was relaunched
  alone and waited ``--cluster_time_out`` for peers that were gone, or the group
  restarted for nothing);
* a relaunch whose process cannot be started (an OSError escaped the loop);
* any other exception in the loop: the orderly stop, ``job_end``, exit 70;
* a group restart waits 2 s, not ``--grace_period``, for a worker that never registered
  and ignores SIGTERM;
* a stalled scheduler (SIGSTOP) does not delay a relaunch.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from launcher.config import LaunchConfig
from launcher.supervisor.loop import EXIT_SUPERVISOR_ERROR, Supervisor
from launcher.view.render import PlainView
from recovery.events import EventLog
from support import BIN, TFT_OFF, events, log_has, spawn, spawned_pids, terminate, tftrun_cmd, wait_for, wait_for_event

pytestmark = pytest.mark.timeout(240)

EVENT = 60
"""Seconds to wait for one event on 2 busy cores."""
JOB_END = 90
"""Seconds the jobs below may take; far below the 600 s of a rank waiting for peers."""


def sched_job(tmp_path: Path, port: int, *options: str, script: tuple[str, ...]) -> list[str]:
    return tftrun_cmd("--worker_num=3", f"--log_dir={tmp_path / 'logs'}", f"--master_port={port}",
                      f"--recovery_path={tmp_path / 'recovery'}", "--grace_period=5", *options,
                      str(BIN / "sched_train.py"), *script)


def finish(proc: subprocess.Popen[str], timeout: float = JOB_END) -> str:
    """Wait for tftrun to end (terminate it whatever happens); its output."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        terminate(proc)
    return stdout + stderr


def test_a_relaunch_in_cooldown_when_the_group_must_restart_does_not_crash_tftrun(
        tmp_path: Path, free_port: int) -> None:
    """After the last step, rank 1 crashes (its relaunch waits a 6 s cooldown), rank 0
    exits 0, and rank 2 stays up. A relaunch alone can no longer rejoin anyone: once due,
    the group restarts, the waiting relaunch withdrawn into it (it crashed the loop with
    ``illegal move cooldown -> cooldown``), and the second launch ends the job."""
    log_dir = tmp_path / "logs"
    proc = spawn(sched_job(tmp_path, free_port, "--rejoin_cooldown=6", script=(
        "--steps", "5", "--teardown", "1:1:0", "--teardown", "0:0:1.5",
        "--linger-rank", "2")), env=TFT_OFF)
    output = finish(proc)
    assert proc.returncode == 0, output
    assert "Traceback" not in output
    [end] = events(log_dir, "job_end")
    assert (end["exitcode"], end["restarts"], end["relaunches"]) == (0, 1, 0)
    [restart] = events(log_dir, "restart")
    assert (restart["what"], restart["ranks"]) == ("workers", [0, 1, 2])
    assert "after ranks [0] finished" in restart["why"]
    assert [e["rank"] for e in events(log_dir, "fault")] == [1]
    stopped = [e for e in events(log_dir, "exit") if e["rank"] == 2 and e["expected"]]
    assert stopped, "rank 2 was stopped (SIGTERM) when the restart was decided"


@pytest.mark.parametrize(("cooldown", "relaunches"), [(0, 1), (3, 0)])
def test_a_rank_that_crashes_in_its_teardown_ends_the_job_in_seconds_with_status_0(
        tmp_path: Path, free_port: int, cooldown: int, relaunches: int) -> None:
    """Rank 1 exits 3 right after its last step (a teardown segfault), 2 s before ranks 0
    and 2 exit 0. With no cooldown it is relaunched at once; with one, its relaunch waits.
    Either way it could only wait ``--cluster_time_out`` (600 s) for peers that are gone:
    once they all exited 0 it is stopped, and as it had reached their final step the job
    ends with status 0 and a ``teardown_crash`` warning, no group restart."""
    log_dir = tmp_path / "logs"
    proc = spawn(sched_job(tmp_path, free_port, f"--rejoin_cooldown={cooldown}", script=(
        "--steps", "5", "--teardown", "1:3:0", "--teardown", "0:0:2",
        "--teardown", "2:0:2")), env=TFT_OFF)
    output = finish(proc, timeout=60)
    assert proc.returncode == 0, output
    [crash] = events(log_dir, "teardown_crash")
    assert (crash["rank"], crash["cause"], crash["step"], crash["final_step"]) == (
        1, "exit code 3", 5, 5)
    assert [r["what"] for r in events(log_dir, "restart")] == ["rank"] * relaunches
    peers = [e for e in events(log_dir, "exit") if e["rank"] in (0, 2)]
    assert [e.get("exitcode") for e in peers] == [0, 0]
    [end] = events(log_dir, "job_end")
    assert end["exitcode"] == 0 and "teardown" in end["reason"]
    assert end["ts"] - max(e["ts"] for e in peers) < 10


def test_a_relaunch_that_cannot_be_started_is_a_failed_launch_charged_to_the_budget(
        tmp_path: Path, free_port: int) -> None:
    """Rank 1's log is replaced by a folder, then rank 1 is killed: each relaunch fails
    to start (IsADirectoryError), costs one restart, and once the two are spent tftrun
    stops the survivors in order, says why in ``job_end`` and exits 127."""
    log_dir = tmp_path / "logs"
    proc = spawn(sched_job(tmp_path, free_port, "--rejoin_cooldown=0", "--max_restarts=2",
                           script=("--rejoin",)), env=TFT_OFF)
    try:
        wait_for(lambda: log_has(log_dir, 1, "rank 1 of 3 in generation 0"), EVENT, "rank 1 up")
        first = spawned_pids(log_dir)
        (log_dir / "worker_1.log").unlink()
        (log_dir / "worker_1.log").mkdir()
        os.kill(first[1], signal.SIGKILL)
        output = finish(proc)
    finally:
        terminate(proc)
        shutil.rmtree(log_dir / "worker_1.log", ignore_errors=True)
    assert proc.returncode == 127, output
    assert "Traceback" not in output
    faults = events(log_dir, "fault")
    assert [(f["rank"], f["cause"]) for f in faults] == [(1, "SIGKILL"), (1, "spawn"), (1, "spawn")]
    assert all(f["pid"] is None and "Is a directory" in f["error"] for f in faults[1:])
    [end] = events(log_dir, "job_end")
    assert end["exitcode"] == 127 and end["relaunches"] == 2
    assert "could not be started" in end["reason"] and "restart budget (2) spent" in end["reason"]
    survivors = [e for e in events(log_dir, "exit") if e["rank"] in (0, 2)]
    assert sorted(e["rank"] for e in survivors) == [0, 2]
    assert all(e["expected"] for e in survivors)


class _Broken(RuntimeError):
    """The fault injected into the supervisor's loop below."""


def test_an_exception_in_the_loop_stops_every_process_in_order(
        tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop raises once both workers run: each worker still gets SIGTERM and its
    grace period (it writes its last words), ``job_end`` names the error, and ``run``
    returns 70 instead of raising."""
    log_dir = tmp_path / "logs"
    config = LaunchConfig(script=BIN / "term_last_words.py", worker_num=2, log_dir=log_dir,
                          master_port=free_port, grace_period=10,
                          recovery_path=tmp_path / "recovery")
    config.validate()

    def broken(self: Supervisor) -> None:
        if log_has(log_dir, 0, "running") and log_has(log_dir, 1, "running"):
            raise _Broken("injected")

    monkeypatch.setattr(Supervisor, "_tell_retirements", broken)
    out = io.StringIO()
    status = Supervisor(config, None, PlainView(out), EventLog(log_dir)).run()
    assert status == EXIT_SUPERVISOR_ERROR, out.getvalue()
    for rank in (0, 1):
        assert log_has(log_dir, rank, "got SIGTERM: last words written")
    exits = [e for e in events(log_dir, "exit") if e["role"] == "worker"]
    assert sorted((e["rank"], e["expected"], e.get("exitcode")) for e in exits) == [
        (0, True, 143), (1, True, 143)]
    [end] = events(log_dir, "job_end")
    assert end["exitcode"] == EXIT_SUPERVISOR_ERROR
    assert end["reason"] == "supervisor error: _Broken: injected"
    assert events(log_dir)[-1]["event"] == "job_end"


@pytest.mark.parametrize(("script", "status", "why"), [
    (("--no-such-option",), 2, "a usage error of the script"),
    (("--wrong-token-rank", "1"), 77, "its registration was refused for good"),
])
def test_an_exit_no_restart_can_fix_ends_the_job_at_once(
        tmp_path: Path, free_port: int, script: tuple[str, ...], status: int, why: str) -> None:
    """A usage error (argparse's exit 2) or a registration refused for good (exit 77):
    no restart is spent on it; tftrun stops the others and exits with that status."""
    log_dir = tmp_path / "logs"
    proc = spawn(sched_job(tmp_path, free_port, "--rejoin_cooldown=0", script=script),
                 env=TFT_OFF)
    output = finish(proc)
    assert proc.returncode == status, output
    assert not events(log_dir, "restart")
    [end] = events(log_dir, "job_end")
    assert end["exitcode"] == status and why in end["reason"], end
    assert "no restart can fix it" in end["reason"]


def test_a_group_restart_kills_a_worker_that_ignores_sigterm_after_a_short_grace(
        tmp_path: Path, free_port: int) -> None:
    """Rank 1 of a plain script fails while rank 0 catches SIGTERM and keeps running. The
    group restart SIGKILLs rank 0 after RESTART_GRACE (2 s), not ``--grace_period=30``."""
    log_dir = tmp_path / "logs"
    proc = spawn(tftrun_cmd("--worker_num=2", f"--log_dir={log_dir}", f"--master_port={free_port}",
                            f"--recovery_path={tmp_path / 'recovery'}", "--grace_period=30",
                            str(BIN / "holds_term.py")))
    output = finish(proc, timeout=60)
    assert proc.returncode == 0, output
    assert log_has(log_dir, 0, "got SIGTERM: going on")
    [fault] = events(log_dir, "fault")
    [restart] = events(log_dir, "restart")
    [held] = [e for e in events(log_dir, "exit") if e["rank"] == 0 and e["incarnation"] == 0]
    assert (held["expected"], held.get("signal")) == (True, "SIGKILL")
    assert 1.5 < restart["ts"] - fault["ts"] < 10, "SIGKILL after about 2 s, not 30"


def test_a_stalled_scheduler_does_not_delay_a_relaunch(tmp_path: Path, free_port: int) -> None:
    """The scheduler is stopped (SIGSTOP: every request waits its 1 s reply timeout), then
    rank 1 is killed: it is relaunched at once, since no round trip is on the loop's path
    (each cost a second before: the exit report, the verdicts, the cooldown)."""
    log_dir = tmp_path / "logs"
    proc = spawn(sched_job(tmp_path, free_port, "--rejoin_cooldown=0", script=("--rejoin",)),
                 env=TFT_OFF)
    try:
        wait_for_event(log_dir, EVENT, "generation 0", event="generation", generation=0)
        wait_for(lambda: any(c.raddr and c.raddr.port == free_port and c.status == "ESTABLISHED"
                             for c in psutil.Process(proc.pid).net_connections()),
                 EVENT, "tftrun connected to the scheduler")
        scheduler = spawned_pids(log_dir, "scheduler")[None]
        os.kill(scheduler, signal.SIGSTOP)
        try:
            os.kill(spawned_pids(log_dir)[1], signal.SIGKILL)
            restart = wait_for_event(log_dir, EVENT, "rank 1 relaunched", event="restart")
        finally:
            os.kill(scheduler, signal.SIGCONT)
        [fault] = events(log_dir, "fault")
        assert restart["ts"] - fault["ts"] < 0.8
        proc.send_signal(signal.SIGTERM)
        finish(proc)
    finally:
        terminate(proc)
