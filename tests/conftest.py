"""Shared test fixtures: no process outlives its test, and waits are on conditions.

The pytest process makes itself a *child subreaper*, so every process a test starts,
even one orphaned by a ``kill -9`` of its parent, stays a descendant of pytest. After
each test, any descendant still alive is a leak: it is killed, reaped, and the test fails.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from recovery import env as names
from support import free_tcp_port
from support.chaos import CHAOS_SEED, SEED_VARIABLE

PR_SET_CHILD_SUBREAPER = 36

def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


_become_subreaper()


# One seed for the whole run: pytest-xdist's workers import this file after the
# controller, and each must draw the same chaos schedule (the test ids carry the seed).
os.environ.setdefault(SEED_VARIABLE, str(CHAOS_SEED))

# The suite starts hundreds of Python processes of the product (tftrun, its scheduler and
# fork server, tftctl): they keep their compiled bytecode, as Python does by default, even
# where the environment turned that off, rather than each compiling launcher/ and
# recovery/ again. The workers pytest-xdist starts after this inherit it too.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_report_header() -> str:
    return f"chaos seed: {CHAOS_SEED} (replay: {SEED_VARIABLE}={CHAOS_SEED})"


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _live_descendants() -> list[psutil.Process]:
    alive = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    return alive


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail a test that leaves any process running; kill and reap what it left."""
    yield
    # A process being torn down by its parent may need a moment to go.
    deadline = time.monotonic() + 5.0
    leftovers = _live_descendants()
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.05)
        _reap_all()
        leftovers = _live_descendants()
    described = []
    for proc in leftovers:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(leftovers, timeout=5)
    _reap_all()
    assert not described, "processes outlived the test:\n" + "\n".join(described)


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_tcp_port()


@pytest.fixture(autouse=True)
def own_recovery_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test is a job of its own: its default recovery path (``MS_RECOVERY_PATH``,
    where a process started without tftrun keeps its lineage) is in its tmp dir, never
    ``./tft_recovery`` in the repository. Subprocesses inherit it."""
    path = tmp_path / "tft_recovery"
    monkeypatch.setenv(names.MS_RECOVERY_PATH, str(path))
    monkeypatch.delenv(names.TFT_LINEAGE, raising=False)
    return path
