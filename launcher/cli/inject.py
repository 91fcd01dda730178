"""``tftctl inject``: rehearse a failure of one rank of a running job (docs/fault-injection.md). ``kill`` and
``term`` without ``--at_step`` are signals sent from here at once; every other fault goes through the scheduler,
signed with the job token of the trusted scheduler (launcher/cli/trusted.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Annotated, Any

import psutil
import typer

from launcher.cli.status import NoJobError, connect, query
from launcher.errors import ConfigError, TftrunError
from recovery.control.inject import FAULTS, Injection, check, check_fault, new_id
from recovery.control.members import LIVE_STATES
from recovery.control.rpc import Op
from recovery.env import WorkerEnv
from recovery.events import EventLog

__all__ = ["inject"]

_SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM}


def _process_env(pid: int) -> WorkerEnv | None:
    """The env contract as process ``pid`` sees it; ``None`` when it cannot be read."""
    try:
        return WorkerEnv.from_env(psutil.Process(pid).environ())
    except (psutil.Error, ValueError):
        return None


def _holder(status: dict[str, Any], rank: int) -> int | None:
    """The pid of the live process holding ``rank``, as the scheduler reports it."""
    return next((m["pid"] for m in status["members"]
                 if m["rank"] == rank and m["state"] in LIVE_STATES), None)


def _signal_target(status: dict[str, Any], rank: int) -> int | None:
    """The pid of the process holding ``rank``, if its environment names this job's run id: a pid the
    scheduler reports may be another host's, or reused."""
    pid = _holder(status, rank)
    seen = None if pid is None else _process_env(pid)
    return pid if seen is not None and seen.run_id == status["run_id"] else None


def inject(
    log_dir: Annotated[Path, typer.Option("--log_dir", "--log-dir",
                                          help="The job's log dir (tftrun's --log_dir).")],
    rank: Annotated[int, typer.Option("--rank", help="The rank to fail.")],
    fault: Annotated[str, typer.Option("--fault", help=f"One of: {', '.join(FAULTS)}.")],
    at_step: Annotated[int | None, typer.Option(
        "--at_step", "--at-step", help="The global step at which the rank fails. "
        "[default: its next step; kill/term: at once, by signal]", show_default=False)] = None,
    factor: Annotated[float | None, typer.Option(
        "--factor", help="--fault slow: how many times slower the rank's steps become.",
        show_default=False)] = None,
) -> None:
    """Inject FAULT into rank RANK of the job running with LOG_DIR."""
    problem = check_fault(fault, at_step, factor)  # the rank is checked against the job's size
    if problem is not None:
        raise ConfigError(problem)
    try:
        status = query(log_dir)
    except NoJobError as err:
        raise ConfigError(str(err)) from None
    problem = check(rank, fault, at_step, status["worker_num"], factor)
    if problem is not None:
        raise ConfigError(problem)
    pid = _signal_target(status, rank) if fault in _SIGNALS and at_step is None else None
    if pid is not None:
        EventLog(log_dir).emit("inject", rank=rank, fault=fault, at_step=None, id=new_id(),
                               via="signal", pid=pid)
        os.kill(pid, _SIGNALS[fault])
        typer.echo(f"injected {fault} into rank {rank} (pid {pid}): "
                   f"{_SIGNALS[fault].name} sent")
        return
    try:
        with connect(log_dir) as link:
            reply = link.call(Op.INJECT, rank=rank, fault=fault, at_step=at_step, factor=factor)
    except NoJobError as err:
        raise ConfigError(str(err)) from None
    if not reply.get("ok"):
        raise TftrunError(f"the scheduler refused the injection: {reply.get('message')}")
    when = Injection(reply["id"], rank, fault, at_step).when
    pid = _holder(status, rank)
    holder = "no live process yet" if pid is None else f"pid {pid}"
    slower = "" if factor is None else f" ({factor:g}x slower)"
    typer.echo(f"injected {fault}{slower} into rank {rank} ({holder}) {when}")
