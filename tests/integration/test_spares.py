"""The supervisor's pool of warm spares, with stand-in spares that need no torch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.procs.process import Child, spawn
from launcher.procs.spare_pool import SparePool, resident_mib
from launcher.procs.spec import ProcessSpec, Role
from support import wait_for

DELAY = 0.3
STAND_IN = "import os, sys; print(os.read(int(sys.argv[1]), 65536).decode(), flush=True)"
"""Echoes what it reads from its go pipe to its log, then exits 0."""


class Starter:
    """``SparePool``'s start callback: stand-in spares logging to ``tmp_path/spare.log``."""

    def __init__(self, tmp_path: Path) -> None:
        self.log = tmp_path / "spare.log"
        self.started: list[Child] = []

    def __call__(self, go_fd: int, serial: int) -> Child:
        child = spawn([sys.executable, "-c", STAND_IN, str(go_fd)], os.environ, self.log,
                      f"spare {serial}", pass_fds=(go_fd,))
        self.started.append(child)
        return child


def tended(pool: SparePool, starter: Starter, count: int) -> bool:
    """Tend the pool once; whether ``count`` spares were started by now."""
    pool.tend()
    return len(starter.started) >= count


def worker(tmp_path: Path) -> ProcessSpec:
    return ProcessSpec(Role.WORKER, 1, ("python", "-u", "train.py"), {"RANK": "1"},
                       tmp_path / "worker_1.log")


def test_spares_start_after_the_delay_and_a_used_one_is_replaced_later(tmp_path: Path) -> None:
    starter = Starter(tmp_path)
    pool = SparePool(1, starter, delay=DELAY)
    pool.tend()
    assert not starter.started  # not at once: the job's own start comes first
    assert pool.hand_over(worker(tmp_path), ("train.py",), "header") is None
    wait_for(lambda: tended(pool, starter, 1), 10, "the first spare")
    [first] = starter.started
    child = pool.hand_over(worker(tmp_path), ("train.py", "--epochs", "2"), "==== header ====")
    assert child is first
    assert child.process.wait(timeout=30) == 0
    log = (tmp_path / "worker_1.log").read_text()
    assert log.startswith("==== header ====\n")
    assert '"argv": ["train.py", "--epochs", "2"]' in (tmp_path / "spare.log").read_text()
    assert '"env": {"RANK": "1"}' in (tmp_path / "spare.log").read_text()
    pool.tend()
    assert len(starter.started) == 1  # the replacement waits its delay too
    wait_for(lambda: tended(pool, starter, 2), 10, "the replacement spare")
    [(stopped, returncode)] = pool.stop(signal.SIGTERM, 5)
    assert stopped.child is starter.started[1] and returncode is not None


def test_an_idle_spare_that_dies_is_reported_once_and_replaced(tmp_path: Path) -> None:
    starter = Starter(tmp_path)
    pool = SparePool(1, starter, delay=DELAY)
    wait_for(lambda: tended(pool, starter, 1), 10, "the first spare")
    starter.started[0].signal_group(signal.SIGKILL)
    [(dead, returncode)] = wait_for(pool.tend, 10, "the dead spare reported")
    assert dead.child is starter.started[0] and returncode == -signal.SIGKILL
    wait_for(lambda: tended(pool, starter, 2), 10, "its replacement")
    assert pool.hand_over(worker(tmp_path), ("train.py",), "header") is starter.started[1]
    assert starter.started[1].process.wait(timeout=30) == 0
    assert pool.stop(signal.SIGTERM, 5) == []


@pytest.mark.parametrize("size", [0, 2])
def test_the_pool_keeps_size_spares(tmp_path: Path, size: int) -> None:
    starter = Starter(tmp_path)
    pool = SparePool(size, starter, delay=0)
    pool.tend()
    assert len(starter.started) == size
    assert len(pool.stop(signal.SIGTERM, 5)) == size


def test_a_pool_told_to_keep_a_spare_starts_it_at_once_and_shows_its_memory(
        tmp_path: Path) -> None:
    """The automatic spare (no --warm_spare) starts when it becomes useful, not a delay
    later; the live view's caption names it with its resident memory."""
    starter = Starter(tmp_path)
    pool = SparePool(0, starter, delay=60)
    pool.tend()
    assert not starter.started and pool.describe() == ""
    pool.keep(1)
    pool.tend()
    [spare] = starter.started
    assert pool.size == 1
    assert pool.describe().startswith(f"1 warm spare: pid {spare.pid} (")
    assert pool.describe().endswith(" MiB resident)")
    pool.stop(signal.SIGTERM, 5)


def test_the_resident_memory_of_a_gone_process_is_unknown() -> None:
    assert resident_mib(os.getpid()) > 1
    assert resident_mib(2**22 + 1) is None


def test_a_start_up_lowers_the_priority_only_where_it_may_go_back() -> None:
    """Run in a child: a priority cannot be raised back in the test's own process."""
    code = ("import os; from recovery.priority import lower_priority, restore_priority; "
            "p = lower_priority(); low = os.getpriority(os.PRIO_PROCESS, 0); "
            "p is None or restore_priority(p); "
            "print(p, low, os.getpriority(os.PRIO_PROCESS, 0))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    before, low, after = done.stdout.split()
    if before == "None":  # not root and no RLIMIT_NICE: it keeps its priority throughout
        assert low == after
    else:
        assert int(low) > int(before) and int(after) == int(before)
