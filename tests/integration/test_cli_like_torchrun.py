"""tftrun's command line, run as a new user runs it: no worker count and no port, msrun's
``--bind_core``, ``--worker_log_name`` and ``--tail_worker_log``, and what the console
says of the run (the clean exit, the end summary)."""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path

import pytest

from launcher.procs.cores import share_of
from support import events, run
from support.mnist import TRAIN

pytestmark = pytest.mark.timeout(180)

STEPS = 20


def bare_tftrun(tmp_path: Path, *args: str) -> list[str]:
    """tftrun with only what a new user gives: no worker count, no port (support.tftrun_cmd
    would add one); the folders in ``tmp_path``."""
    return [sys.executable, "-m", "launcher.cli.tftrun",
            f"--log_dir={tmp_path / 'logs'}", f"--recovery_path={tmp_path / 'recovery'}", *args]


def test_a_bare_command_line_is_one_worker_on_a_free_port_and_ends_cleanly(tmp_path: Path) -> None:
    result = run(bare_tftrun(tmp_path, str(TRAIN), "--epochs", "1", "--max_steps", str(STEPS),
                             "--synthetic_size", "2000", "--log_every", "5"), timeout=150)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.glob("worker_*.log")) == ["worker_0.log"], output
    port = re.search(r"tftrun: master port (\d+) \(a free port, picked for this job\)", result.stderr)
    assert port is not None, output
    assert [e["master_port"] for e in events(logs, "job_start")] == [int(port.group(1))]
    assert re.search(r"tftrun: exit role=worker rank=0 pid=\d+ incarnation=0 exitcode=0[^\n]*: "
                     r"a clean exit\n", result.stdout), output
    assert "expected=False exitcode=0" not in result.stdout
    (worker_exit,) = [e for e in events(logs, "exit") if e["role"] == "worker"]
    assert (worker_exit["expected"], worker_exit["outcome"], worker_exit["exitcode"]) == (
        False, "clean", 0)
    summary = re.search(r"wall time ([\d.]+) s, final step (\d+) of (\d+), ([\d.]+) steps/s; "
                        r"logs in (\S+)", result.stdout)
    assert summary is not None, output
    assert summary.group(2) == summary.group(3) == str(STEPS)
    assert float(summary.group(1)) > 0 and float(summary.group(4)) > 0
    assert summary.group(5) == str(logs.resolve())


AFFINITY = """
import os, time
from launcher.procs.cores import share_of
node = sorted(os.sched_getaffinity(0))  # tftrun's, inherited: pinned within moments
want = share_of(node, int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))
deadline = time.monotonic() + 10
while os.sched_getaffinity(0) != want and time.monotonic() < deadline:
    time.sleep(0.01)
print("cores", os.environ["LOCAL_RANK"], sorted(os.sched_getaffinity(0)), flush=True)
"""


@pytest.mark.parametrize("fork", ["--fork_server=True", "--fork_server=0"])
def test_bind_core_pins_each_worker_to_its_share_of_the_cores(tmp_path: Path, fork: str) -> None:
    script = tmp_path / "affinity.py"
    script.write_text(AFFINITY)
    result = run(bare_tftrun(tmp_path, "--nproc_per_node=2", "--bind_core", fork, "--join=True",
                             str(script)), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    node = sorted(os.sched_getaffinity(0))
    for rank in (0, 1):
        assert f"[rank {rank}] cores {rank} {sorted(share_of(node, 2, rank))}\n" in result.stdout, (
            result.stdout + result.stderr)


HELLO = "import os\nprint('hello from', os.environ['RANK'], flush=True)\n"


def test_worker_log_name_and_tail_worker_log_as_msrun_gives_them(tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    command = bare_tftrun(tmp_path, "--nproc_per_node=2", "--fork_server=False",
                          "--worker_log_name=w_{hostname}", "--tail_worker_log=1", str(script))
    logs, host = tmp_path / "logs", socket.gethostname()
    for _ in range(2):  # the second run moves the first one's logs aside
        result = run(command, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "[rank 1] hello from 1\n" in result.stdout, result.stdout
        assert "hello from 0" not in result.stdout
        for rank in (0, 1):
            log = logs / f"w_{host}_{rank}.log"
            assert log.read_text().count(f"hello from {rank}") == 1
        assert not list(logs.glob("worker_*.log"))
    assert (logs / "previous" / "1" / f"w_{host}_0.log").exists()
