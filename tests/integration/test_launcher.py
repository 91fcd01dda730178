"""tftrun with real processes: the env contract, the spent budget, signals, logs, bad input."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from recovery import env as names
from support import (
    BIN,
    events,
    free_tcp_port,
    log_has,
    pid_gone,
    run,
    spawn,
    spawned_pids,
    terminate,
    tftrun_cmd,
    wait_for,
    wait_for_event,
)

pytestmark = pytest.mark.timeout(180)


def launch_args(log_dir: Path, port: int, workers: int, *extra: str) -> list[str]:
    return [f"--worker_num={workers}", f"--log_dir={log_dir}", f"--master_port={port}",
            "--grace_period=5", *extra]


def start_endless_job(tmp_path: Path, port: int, *extra: str) -> tuple[subprocess.Popen[str], Path, list[int]]:
    """A 2-worker job that trains until stopped; returns once both ranks step."""
    log_dir, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    ckpt.mkdir()
    proc = spawn(tftrun_cmd(*launch_args(log_dir, port, 2, *extra),
                            str(BIN / "plain_resumable.py"), "100000", str(ckpt)))
    try:
        wait_for(lambda: log_has(log_dir, 0, "step=2") and log_has(log_dir, 1, "step=2"), 60,
                 "training under way")
    except BaseException:
        terminate(proc)
        raise
    pids = [*spawned_pids(log_dir).values(), *spawned_pids(log_dir, "scheduler").values()]
    return proc, log_dir, pids


def run_allreduce(tmp_path: Path, port: int, workers: int, steps: int,
                  *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run plain_allreduce.py under tftrun; return the result and the script's output dir."""
    out = tmp_path / "out"
    out.mkdir()
    result = run(tftrun_cmd(*launch_args(tmp_path / "logs", port, workers, *extra),
                            str(BIN / "plain_allreduce.py"), str(steps), str(out)))
    assert result.returncode == 0, result.stderr
    return result, out


AllreduceRun = tuple[subprocess.CompletedProcess[str], Path, int]
"""A finished run of plain_allreduce.py: its result, its folder and its port."""


@pytest.fixture(scope="module")
def allreduce_job(tmp_path_factory: pytest.TempPathFactory) -> AllreduceRun:
    """One 3-rank run of plain_allreduce.py (3 steps) with ``--join=True``, for the tests of
    what a job sees and prints."""
    tmp_path, port = tmp_path_factory.mktemp("allreduce"), free_tcp_port()
    result, _ = run_allreduce(tmp_path, port, 3, 3, "--join=True", f"--recovery_path={tmp_path / 'r'}")
    return result, tmp_path, port


def test_env_contract_per_rank(allreduce_job: AllreduceRun) -> None:
    _, tmp_path, free_port = allreduce_job
    out = tmp_path / "out"
    seen = [json.loads((out / f"env_{rank}.json").read_text()) for rank in range(3)]
    run_ids = {s["env"][names.TORCHELASTIC_RUN_ID] for s in seen}
    assert len(run_ids) == 1
    # The first launch on one node meets at the scheduler's store: new, so it holds no
    # earlier attempt's keys (a group restart meets at a fresh store of its own).
    assert {s["env"][names.MASTER_PORT] for s in seen} == {str(free_port)}
    for rank, s in enumerate(seen):
        env = s["env"]
        assert env[names.RANK] == env[names.LOCAL_RANK] == env[names.MS_NODE_ID] == str(rank)
        assert env[names.WORLD_SIZE] == env[names.LOCAL_WORLD_SIZE] == env[names.MS_WORKER_NUM] == "3"
        assert env[names.GROUP_RANK] == "0"
        assert env[names.MASTER_ADDR] == env[names.MS_SCHED_HOST] == "127.0.0.1"
        assert env[names.MS_SCHED_PORT] == str(free_port)
        assert env[names.MS_ROLE] == names.ROLE_WORKER
        assert env[names.TORCHELASTIC_RESTART_COUNT] == env[names.TFT_RESTART_COUNT] == "0"
        assert env[names.TORCHELASTIC_MAX_RESTARTS] == "3"
        assert env[names.TFT_INCARNATION] == "0"
        assert env[names.TFT_LOG_DIR] == str((tmp_path / "logs").resolve())
        assert env[names.OMP_NUM_THREADS] == "1"
        assert s["world_size"] == 3
    # The same all_reduce'd value on every rank.
    assert len({s["value"] for s in seen}) == 1
    spawn_events = events(tmp_path / "logs", "spawn")
    assert {(e["role"], e["rank"]) for e in spawn_events} == {
        ("scheduler", None), ("worker", 0), ("worker", 1), ("worker", 2)}
    assert [e["event"] for e in events(tmp_path / "logs")][0] == "job_start"
    assert events(tmp_path / "logs", "job_end")[-1]["exitcode"] == 0


def test_plain_ddp_script_trains_to_the_same_parameters_on_every_rank(
        tmp_path: Path, free_port: int) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = run(tftrun_cmd(*launch_args(tmp_path / "logs", free_port, 2),
                            str(BIN / "plain_ddp.py"), str(out)))
    assert result.returncode == 0, result.stderr
    digests = [json.loads((out / f"params_{rank}.json").read_text()) for rank in range(2)]
    assert digests[0]["final"] == digests[1]["final"]
    assert digests[0]["final"] != digests[0]["initial"]  # it did train


@pytest.mark.parametrize(("fail_code", "status"), [("3", 3), ("-11", 128 + 11)])
def test_spent_budget_prints_the_summary_and_exits_with_the_failing_code(
        tmp_path: Path, free_port: int, fail_code: str, status: int) -> None:
    log_dir, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    ckpt.mkdir()
    result = run(tftrun_cmd(*launch_args(log_dir, free_port, 2, "--max_restarts=1"),
                            str(BIN / "plain_resumable.py"), "20", str(ckpt), "1", fail_code))
    assert result.returncode == status, result.stdout + result.stderr
    assert [r["restart_count"] for r in events(log_dir, "restart")] == [1]
    assert events(log_dir, "job_end")[-1]["exitcode"] == status
    assert "tftrun summary" in result.stdout
    assert "Root cause (first observed failure): rank 1" in result.stdout
    assert "about to fail on purpose" in result.stdout  # the failing rank's last log lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                                 signal.SIGUSR1, signal.SIGUSR2])
def test_signal_to_tftrun_stops_everything(tmp_path: Path, free_port: int, sig: int) -> None:
    """Each signal tftrun handles by default stops the job in order, exit 128+N; the
    workers get the same signal (the plain script does not handle it: they die of it)."""
    proc, log_dir, pids = start_endless_job(tmp_path, free_port)
    try:
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        terminate(proc)
    assert proc.returncode == 128 + sig
    assert all(pid_gone(pid) for pid in pids)
    assert events(log_dir, "job_end")[-1]["exitcode"] == 128 + sig
    if sig != signal.SIGINT:  # Python turns SIGINT into KeyboardInterrupt, exit 1
        exits = [e for e in events(log_dir, "exit") if e["role"] == "worker"]
        assert [(e["expected"], e.get("signal")) for e in exits] == [
            (True, signal.Signals(sig).name)] * 2


@dataclass
class EndlessJobSeen:
    """What one endless job showed while both ranks stepped, then after a ``kill -9`` of
    its tftrun."""

    tftrun_maps: str
    scheduler_oom_score_adj: int
    others_oom_score_adj: list[int]
    alive_2s_after_the_kill: list[int]


@pytest.fixture(scope="module")
def endless_job_seen(tmp_path_factory: pytest.TempPathFactory) -> EndlessJobSeen:
    """One endless job for the tests that only look at a running job and at its end by
    ``kill -9``."""
    tmp_path = tmp_path_factory.mktemp("endless")
    proc, log_dir, pids = start_endless_job(tmp_path, free_tcp_port(), f"--recovery_path={tmp_path / 'r'}")
    try:
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        scheduler = oom_score_adj(spawned_pids(log_dir, "scheduler")[None])
        others = [oom_score_adj(pid) for pid in [proc.pid, *spawned_pids(log_dir).values()]]
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 2.0
        while (alive := [pid for pid in pids if not pid_gone(pid)]) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        terminate(proc)
    return EndlessJobSeen(maps, scheduler, others, alive)


def test_on_one_node_tftrun_imports_no_torch_while_a_plain_job_starts_and_trains(
        endless_job_seen: EndlessJobSeen) -> None:
    """The workers meet at the scheduler's store and tftrun connects to the scheduler
    only once something needs it: its own torch import (seconds of CPU) does not compete
    with the workers' at launch (docs/benchmarks.md, launch to first step)."""
    assert "libtorch" not in endless_job_seen.tftrun_maps


def test_tftrun_imports_no_torch_to_talk_to_the_scheduler_through_a_relaunch(
        tmp_path: Path, free_port: int) -> None:
    """Registrations, an exit report, cooldowns and verdict polls: the supervisor speaks the
    scheduler's store protocol itself (recovery/control/tcpstore_client.py), so its torch
    import (seconds of CPU, ~290 MiB) no longer competes with training."""
    log_dir = tmp_path / "logs"
    proc = spawn(tftrun_cmd(*launch_args(log_dir, free_port, 2, "--rejoin_cooldown=0",
                                         f"--recovery_path={tmp_path / 'r'}"),
                            str(BIN / "sched_train.py"), "--rejoin"))
    try:
        wait_for_event(log_dir, 60, "generation 0", event="generation", generation=0)
        # A forked rank may register before tftrun has written its spawn event.
        os.kill(wait_for(lambda: spawned_pids(log_dir).get(1), 10, "rank 1's spawn event"), signal.SIGKILL)
        wait_for_event(log_dir, 60, "generation 1, with the relaunched rank",
                       event="generation", generation=1)
        assert "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text()
    finally:
        terminate(proc)


def test_kill_9_of_tftrun_leaves_no_orphans(endless_job_seen: EndlessJobSeen) -> None:
    assert endless_job_seen.alive_2s_after_the_kill == []


def test_second_run_keeps_the_first_runs_logs(tmp_path: Path, free_port: int) -> None:
    log_dir, out = tmp_path / "logs", tmp_path / "out"
    out.mkdir()
    args = tftrun_cmd(*launch_args(log_dir, free_port, 2), str(BIN / "plain_allreduce.py"),
                      "1", str(out))
    assert run(args).returncode == 0
    first_pids = spawned_pids(log_dir)
    assert run(args).returncode == 0
    archived = log_dir / "previous" / "1"
    assert spawned_pids(archived) == first_pids
    assert "rank=0 incarnation=0" in (archived / "worker_0.log").read_text()
    assert spawned_pids(log_dir) != first_pids
    assert len(events(log_dir, "job_start")) == 1


def test_join_streams_worker_output_prefixed_with_rank(
        allreduce_job: AllreduceRun) -> None:
    result = allreduce_job[0]
    for rank in range(3):
        assert f"[rank {rank}] rank {rank} done" in result.stdout


def test_plain_output_off_a_terminal_is_timestamped_lines(
        allreduce_job: AllreduceRun) -> None:
    result = allreduce_job[0]
    lines = [line for line in result.stdout.splitlines() if " tftrun: " in line]
    assert lines[0].split(" tftrun: ")[1].startswith("job_start")
    assert any(line.split(" tftrun: ")[1].startswith("job_end exitcode=0") for line in lines)


# ------------------------------------------------------------------ bad input
def _bad_input_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    script = str(BIN / "plain_allreduce.py")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    return {
        "worker_num < 1": (["--worker_num=0", script], "--worker_num must be at least 1"),
        "local > total": (["--worker_num=2", "--local_worker_num=3", script],
                          "is more than --worker_num"),
        "missing script": (["--worker_num=1", str(tmp_path / "nope.py")], "script not found"),
        "script is a folder": (["--worker_num=1", str(tmp_path)], "script is not a file"),
        "unwritable log_dir": (["--worker_num=1", f"--log_dir={not_a_dir}/logs", script],
                               "is not writable"),
        "unknown option": (["--worker_num=1", "--bogus=3", script], "--bogus"),
        "bad --join": (["--worker_num=1", "--join=maybe", script], "--join takes True or False"),
    }


@pytest.mark.parametrize("case", ["worker_num < 1", "local > total", "missing script",
                                  "script is a folder", "unwritable log_dir", "unknown option",
                                  "bad --join"])
def test_bad_input_is_one_line_exit_2_and_starts_nothing(
        tmp_path: Path, free_port: int, case: str) -> None:
    args, message = _bad_input_cases(tmp_path)[case]
    log_dir = tmp_path / "logs"
    result = run(tftrun_cmd(f"--master_port={free_port}", f"--log_dir={log_dir}", *args),
                 timeout=30)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (log_dir / "events.jsonl").exists()


def test_master_port_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(tftrun_cmd("--worker_num=1", f"--master_port={port}",
                                f"--log_dir={tmp_path / 'logs'}", str(BIN / "plain_allreduce.py")),
                     timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"tftrun: error: --master_port {port} on 127.0.0.1: already in use")
    assert not (tmp_path / "logs" / "events.jsonl").exists()


def test_no_grandchild_outlives_its_worker_nor_tftrun(tmp_path: Path, free_port: int) -> None:
    """A worker's own children (a DataLoader's processes, a plain ``sleep``) are gone by
    the time its relaunch runs; after a ``kill -9`` of tftrun, every process it started,
    at any depth, is gone within 2 s."""
    log_dir, out = tmp_path / "logs", tmp_path / "out"
    out.mkdir()

    def grandchildren(incarnation: int) -> list[int]:
        path = out / f"{incarnation}.json"
        return json.loads(path.read_text()) if path.exists() else []

    proc = spawn(tftrun_cmd(*launch_args(log_dir, free_port, 1, "--restart_policy=all"),
                            str(BIN / "grandchildren.py"), str(out)))
    try:
        first = wait_for(lambda: grandchildren(0), 60, "the first worker's grandchildren")
        os.kill(spawned_pids(log_dir)[0], signal.SIGKILL)
        second = wait_for(lambda: grandchildren(1), 60, "the relaunched worker's grandchildren")
        assert [pid for pid in first if not pid_gone(pid)] == []  # dead; tftrun reaps them soon
        descendants = psutil.Process(proc.pid).children(recursive=True)
        assert set(second) <= {p.pid for p in descendants}
        proc.kill()
        proc.wait(timeout=10)
        wait_for(lambda: all(pid_gone(p.pid) for p in descendants), 2.0,
                 "every descendant of tftrun gone in 2 s")
    finally:
        terminate(proc)


def oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def test_the_oom_killer_takes_the_scheduler_before_a_rank(endless_job_seen: EndlessJobSeen) -> None:
    """The store lives in the scheduler, and a stranger may fill it: when memory runs out,
    the kernel must take the scheduler (relaunched, freeing what filled it), not a rank."""
    scheduler, others = endless_job_seen.scheduler_oom_score_adj, endless_job_seen.others_oom_score_adj
    assert scheduler == 1000 and max(others) < scheduler, (scheduler, others)
