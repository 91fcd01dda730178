"""Warm spares (``--warm_spare``): the spare program on its own, then a relaunch in a spare."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from launcher.procs.spare import READY
from launcher.procs.spec import OWN_PYTHON, SPARE_PROGRAM
from support import (
    BIN,
    REPO,
    TFT_OFF,
    events,
    kill_rank_and_wait,
    log_has,
    pid_gone,
    spawn,
    spawned_pids,
    terminate,
    tftrun_cmd,
    wait_for,
    wait_for_event,
)
from support.mnist import final_digests, mnist_job

pytestmark = pytest.mark.timeout(300)

WARM_TIMEOUT = 120
"""Seconds a spare may take to import torch on 2 busy cores."""


def spare_is_warm(log_dir: Path, pid: int) -> bool:
    """Whether the spare ``pid`` printed, in ``log_dir/spare.log``, that it is warm."""
    path = log_dir / "spare.log"
    return path.exists() and f"pid={pid}: {READY}" in path.read_text()


@contextmanager
def spare(log_dir: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The spare program started as the supervisor starts it; yields it and its go pipe."""
    read_fd, write_fd = os.pipe()
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "spare.log", "wb") as log:
        proc = subprocess.Popen([*OWN_PYTHON, str(SPARE_PROGRAM), str(read_fd)],
                                pass_fds=(read_fd,), stdout=log, stderr=subprocess.STDOUT,
                                cwd=REPO)
    os.close(read_fd)
    try:
        wait_for(lambda: spare_is_warm(log_dir, proc.pid) or proc.poll() is not None,
                 WARM_TIMEOUT, "the spare to be warm")
        yield proc, write_fd
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def go(write_fd: int, script: Path, *args: str, log: Path) -> None:
    message = {"env": {"TFT_TEST_MARK": "from-go"}, "argv": [str(script), *args],
               "cwd": str(script.parent), "log": str(log)}
    with os.fdopen(write_fd, "wb") as pipe:
        pipe.write(json.dumps(message).encode())


def test_the_spare_becomes_the_script_with_its_env_argv_cwd_log_and_exit_status(
        tmp_path: Path) -> None:
    script = tmp_path / "scripts" / "job.py"
    script.parent.mkdir()
    script.write_text(
        "import os, sys\n"
        "print('mark', os.environ.get('TFT_TEST_MARK'), 'home', os.environ.get('HOME'))\n"
        "print('argv', sys.argv[1:], 'path0', sys.path[0], 'cwd', os.getcwd())\n"
        "print('main', __name__, file=sys.stderr)\n"
        f"print('spare folder on path', {str(SPARE_PROGRAM.parent)!r} in sys.path)\n"
        "sys.exit(3)\n")
    log = tmp_path / "worker_0.log"
    with spare(tmp_path) as (proc, write_fd):
        go(write_fd, script, "--epochs", "2", log=log)
        assert proc.wait(timeout=60) == 3
    lines = log.read_text().splitlines()
    assert "mark from-go home None" in lines  # the environment was replaced, not merged
    assert f"argv ['--epochs', '2'] path0 {script.parent} cwd {script.parent}" in lines
    assert "main __main__" in lines  # stderr too
    assert "spare folder on path False" in lines
    assert "mark" not in (tmp_path / "spare.log").read_text()


def test_an_uncaught_exception_in_the_script_is_logged_and_exits_1(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("raise ValueError('boom')\n")
    log = tmp_path / "worker_0.log"
    with spare(tmp_path) as (proc, write_fd):
        go(write_fd, script, log=log)
        assert proc.wait(timeout=60) == 1
    text = log.read_text()
    assert "Traceback" in text and "ValueError: boom" in text


def test_a_spare_whose_pipe_closes_without_a_go_exits_0_quietly(tmp_path: Path) -> None:
    with spare(tmp_path) as (proc, write_fd):
        os.close(write_fd)
        assert proc.wait(timeout=60) == 0
    assert "Traceback" not in (tmp_path / "spare.log").read_text()


GPU_JOB = """
import os, sys, time
import torch
import torch.distributed as dist
went = time.time()
torch.cuda.set_device(0)
torch.ones(1, device="cuda")
context = time.time()
dist.init_process_group("nccl", init_method=sys.argv[1], rank=0, world_size=1)
total = torch.ones(1, device="cuda")
dist.all_reduce(total)
torch.cuda.synchronize()
print(f"sum {total.item()} context {context - went:.3f}s nccl {time.time() - context:.3f}s")
dist.destroy_process_group()
"""


@pytest.mark.gpu
def test_a_spare_handed_a_rank_makes_its_cuda_context_and_nccl_group(
        tmp_path: Path, free_port: int) -> None:
    """On a GPU the spare has paid python, torch (with its CUDA libraries) and the first
    optimizer; the CUDA context and the NCCL communicator are made after the go, for the
    device the rank is given (docs/warm-spare.md). Prints what they took."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    script = tmp_path / "gpu_job.py"
    script.write_text(GPU_JOB)
    log = tmp_path / "worker_0.log"
    with spare(tmp_path) as (proc, write_fd):
        go(write_fd, script, f"tcp://127.0.0.1:{free_port}", log=log)
        assert proc.wait(timeout=120) == 0, log.read_text()[-2000:]
    [line] = [line for line in log.read_text().splitlines() if line.startswith("sum ")]
    print(line)
    assert line.startswith("sum 1.0 ")


def test_kill_9_of_rank_2_is_relaunched_in_the_warm_spare_and_ends_bitwise_equal(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    """With tftrun's defaults: a script that uses recovery gets one warm spare."""
    log_dir = tmp_path / "warm"
    proc = spawn(mnist_job(tmp_path, "warm", free_port, spare=True), env=TFT_OFF)
    try:
        # The spare may still be warming up when the kill lands (an 80-step job on 2 busy
        # cores can end before it is warm): it is handed the rank all the same.
        started = wait_for_event(log_dir, WARM_TIMEOUT, "a spare to start", event="spawn",
                                 role="spare")
        wait_for(lambda: log_has(log_dir, 2, "step=25 "), 120, "rank 2 past step 25")
        assert not log_has(log_dir, 2, "step=80 "), "the job ended before the kill"
        first = kill_rank_and_wait(proc, log_dir, 2)
    finally:
        terminate(proc)
    assert proc.returncode == 0
    relaunch = events(log_dir, "spawn")
    [warm] = [e for e in relaunch if e.get("warm")]
    # The spare started before the kill became rank 2's next incarnation.
    assert (warm["role"], warm["rank"], warm["pid"], warm["incarnation"]) == (
        "worker", 2, started["pid"], 1)
    assert relaunch.index(started) < relaunch.index(warm)
    assert spawned_pids(log_dir) == {**first, 2: started["pid"]}
    assert [(e["rank"], e["cause"]) for e in events(log_dir, "fault")] == [(2, "SIGKILL")]
    assert not [e for e in events(log_dir, "exit") if e["role"] == "spare" and not e["expected"]]
    assert final_digests(log_dir) == mnist_reference
    # The spare's training output went to rank 2's log, after the header of its launch.
    log = (log_dir / "worker_2.log").read_text()
    relaunched = log[log.index("==== tftrun: worker rank=2 incarnation=1 "):]
    assert "step=80 " in relaunched
    assert "step=" not in (log_dir / "spare.log").read_text()


def test_a_restart_of_all_workers_spawns_them_and_leaves_the_spare_until_the_job_ends(
        tmp_path: Path, free_port: int) -> None:
    log_dir, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    ckpt.mkdir()
    # A plain torchrun script: a dead rank restarts every worker.
    proc = spawn(tftrun_cmd("--worker_num=2", f"--log_dir={log_dir}",
                            f"--master_port={free_port}", "--grace_period=5", "--warm_spare=1",
                            str(BIN / "plain_resumable.py"), "100000", str(ckpt)))
    try:
        started = wait_for_event(log_dir, WARM_TIMEOUT, "a spare to start", event="spawn",
                                 role="spare")
        wait_for(lambda: spare_is_warm(log_dir, started["pid"]), WARM_TIMEOUT,
                 "the spare to be warm")
        os.kill(spawned_pids(log_dir)[1], signal.SIGKILL)
        wait_for(lambda: len(events(log_dir, "spawn")) == 6, 60, "both workers spawned again")
        assert not pid_gone(started["pid"])
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        terminate(proc)
    assert proc.returncode == 143
    respawned = events(log_dir, "spawn")[-2:]
    assert [(e["role"], e["restart_count"], "warm" in e) for e in respawned] == [
        ("worker", 1, False), ("worker", 1, False)]
    assert started["pid"] not in [e["pid"] for e in respawned]
    [spare_exit] = [e for e in events(log_dir, "exit") if e["role"] == "spare"]
    assert (spare_exit["pid"], spare_exit["expected"]) == (started["pid"], True)
    assert pid_gone(started["pid"])
