"""Helpers for tests: wait on conditions and events, run the CLIs, check pids."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from filelock import FileLock

from recovery import env as names
from recovery.control.files import StateFile
from recovery.control.rpc import new_request_id
from recovery.control.signing import Kind, job_key, new_nonce, seal
from recovery.env import DEFAULT_RUN_ID
from recovery.events import read_events

REPO = Path(__file__).resolve().parents[2]
BIN = Path(__file__).resolve().parents[1] / "bin"

T = TypeVar("T")

TFT_OFF = {**os.environ, names.MS_ENABLE_TFT: "{TTP:0,UCE:0,ARF:0}"}
"""The environment of a rollback test: last-words, in-place and replica recovery off."""


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def wait_for_event(
    log_dir: Path, timeout: float, what: str, **match: Any
) -> dict[str, Any]:
    """Wait until events.jsonl holds an event whose fields equal ``match``; return it."""

    def find() -> dict[str, Any] | None:
        for event in read_events(log_dir):
            if all(event.get(k) == v for k, v in match.items()):
                return event
        return None

    return wait_for(find, timeout, what)


def events(log_dir: Path, name: str | None = None) -> list[dict[str, Any]]:
    return [e for e in read_events(log_dir) if name is None or e["event"] == name]


TEST_PORTS = range(20000, 32000)
"""Where tests pick the ports they name: below Linux's ephemeral range (32768-60999 by
default), which the kernel hands to every outgoing connection; a port picked from that range
can be taken by a gloo or store client of another test before the job binds it."""


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that nothing uses right now and no outgoing connection will
    be given: drawn from this xdist worker's share of :data:`TEST_PORTS`, so that two tests
    running side by side never draw the same one."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = len(TEST_PORTS) // workers
    first = TEST_PORTS.start + worker * share
    for port in random.sample(range(first, first + share), share):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{first + share - 1}")


def spawned_pids(log_dir: Path, role: str = "worker") -> dict[int | None, int]:
    """The latest pid of each rank (or of the scheduler) from the spawn events."""
    return {e["rank"]: e["pid"] for e in events(log_dir, "spawn") if e["role"] == role}


def kill_rank_and_wait(proc: subprocess.Popen[str], log_dir: Path, rank: int,
                       timeout: float = 200) -> dict[int | None, int]:
    """``kill -9`` the running process of ``rank``, then wait for the job ``proc`` to end.

    Returns each rank's pid as it was before the kill.
    """
    before = spawned_pids(log_dir)
    os.kill(before[rank], signal.SIGKILL)
    proc.communicate(timeout=timeout)
    return before


def log_has(log_dir: Path, rank: int, text: str) -> bool:
    """Whether ``worker_<rank>.log`` in ``log_dir`` holds ``text``."""
    path = log_dir / f"worker_{rank}.log"
    return path.exists() and text in path.read_text(errors="ignore")


PORT_OPTIONS = ("--master_port", "--master-port", "--standalone", "--rdzv_endpoint",
                "--rdzv-endpoint")
"""A tftrun command line that names none of these gets a free port (``--master_port=0``):
tests run side by side (pytest-xdist), and two on tftrun's default port would collide."""


def tftrun_cmd(*args: str, cwd_recovery_path: bool = False, degraded: bool = False) -> list[str]:
    """tftrun with ``args``.

    Unless ``args`` name ``--recovery_path`` (or ``cwd_recovery_path``: tftrun's own default,
    ``./tft_recovery`` in its working folder), the test's own recovery path
    (``MS_RECOVERY_PATH``, tests/conftest.py): tests run side by side in the repository's
    folder, and a second job on its ``./tft_recovery`` is refused at once (seen in CI: a
    test then waited 120 s for a job that had exited).

    Unless ``degraded`` or ``args`` name ``--min_worker_num``, ``--min_worker_num`` is
    pinned to the job's size (when ``args`` give it): a dead rank then pauses the others
    until it is back, and a run with faults ends bitwise equal to the fault-free one, as
    most tests assert (docs/elastic.md). tftrun's own default trains degraded."""
    size = _worker_num(args)
    pinned = (() if degraded or size is None or "min_worker_num" in _options(args)
              else (f"--min_worker_num={size}",))
    placed = any(arg.startswith(PORT_OPTIONS) for arg in args)
    kept = cwd_recovery_path or any(arg.startswith(("--recovery_path", "--recovery-path"))
                                    for arg in args)
    return [sys.executable, "-m", "launcher.cli.tftrun",
            *(() if placed else ("--master_port=0",)),
            *(() if kept else (f"--recovery_path={os.environ[names.MS_RECOVERY_PATH]}",)),
            *pinned, *args]


def _worker_num(args: Sequence[str]) -> int | None:
    """The job's size that ``args`` give: ``--worker_num``, else ``--nnodes`` (MAX) x
    ``--nproc_per_node`` when both are counts; None if they give none."""
    given = _options(args)
    if given.get("worker_num", "").isdigit():
        return int(given["worker_num"])
    nodes, per_node = given.get("nnodes", "").split(":")[-1], given.get("nproc_per_node", "")
    return int(nodes) * int(per_node) if nodes.isdigit() and per_node.isdigit() else None


def _options(args: Sequence[str]) -> dict[str, str]:
    """``--name=value`` and ``--name value`` of ``args``, by name (``-`` read as ``_``)."""
    found = {}
    for at, arg in enumerate(args):
        if arg.startswith("--"):
            name, _, value = arg[2:].partition("=")
            if not value and at + 1 < len(args):
                value = args[at + 1]
            found.setdefault(name.replace("-", "_"), value)
    return found


def tftctl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher.cli.tftctl", *args]


def spawn(cmd: list[str], **kwargs: Any) -> subprocess.Popen[str]:
    """Start a command in the background with its output captured as text."""
    return subprocess.Popen(
        cmd, cwd=kwargs.pop("cwd", REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, **kwargs,
    )


def run(cmd: list[str], timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=kwargs.pop("cwd", REPO), capture_output=True, text=True, timeout=timeout,
        **kwargs,
    )


def run_together(cmds: list[list[str]], timeout: float,
                 envs: list[dict[str, str]] | None = None) -> list[tuple[int, str, str]]:
    """Run commands at once (the ranks of one group); each one's (status, stdout, stderr).
    Every process is killed and reaped whatever happens."""
    procs = [spawn(cmd, **({} if envs is None else {"env": envs[i]})) for i, cmd in enumerate(cmds)]
    try:
        outputs = [proc.communicate(timeout=timeout) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs)]


def pid_gone(pid: int) -> bool:
    """True when no live process has this pid (a zombie counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def terminate(proc: subprocess.Popen[str], timeout: float = 20) -> None:
    """Stop a test's background command the way a user would: SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def scheduler_stalled(recovery_path: Path) -> Iterator[None]:
    """Hold the lock of the state file of the scheduler under ``recovery_path``, as a slow
    disk or a reader would.

    The scheduler persists every decision before it replies, so while this holds, a
    request that decides something is carried out but not answered, and the requests
    that come meanwhile wait in the queue: they are handled together, in one batch.
    """
    path = StateFile(recovery_path).path
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        yield


def signed_request(token: str, op: str, rid: str | None = None, run_id: str = DEFAULT_RUN_ID,
                   epoch: str = "", **fields: Any) -> bytes:
    """A request as a client of launch ``epoch`` of job ``run_id`` whose token is ``token``
    sends it (a process started without tftrun has no epoch)."""
    return seal(job_key(token, run_id, epoch), Kind.REQUEST, op, rid or new_request_id(),
                new_nonce(), json.dumps(fields)).encode()


def run_gated_with_kills(command: list[str], log_dir: Path, gate: Path, ranks: list[int],
                         at_step: int, timeout: float,
                         then: Callable[[], None] = lambda: None) -> tuple[int, str]:
    """Run ``command``, a tftrun job of tests/bin/gated.py held at ``gate``: once its
    scheduler serves, queue a ``kill -9`` of each of ``ranks`` at ``at_step`` (``tftctl
    inject``), open the gate, call ``then`` (to watch the job while it runs) and wait for
    the job; its status and output."""
    from launcher.cli import tftctl

    proc = spawn(command, env=dict(os.environ))
    try:
        wait_for_event(log_dir, 120, "the scheduler up", event="scheduler_start")
        for rank in ranks:
            assert tftctl.main(["inject", f"--log_dir={log_dir}", f"--rank={rank}",
                                "--fault=kill", f"--at_step={at_step}"]) == 0
        gate.touch()
        then()
        out, err = proc.communicate(timeout=timeout)
    finally:
        terminate(proc)
    return proc.returncode, out + err
