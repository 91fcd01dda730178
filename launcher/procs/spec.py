"""What each child is started as: argv, env (the contract of docs/env.md) and log file."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from launcher.config import LaunchConfig
from launcher.procs.fork_server_main import FORK_SERVER
from launcher.procs.preload import framework_imports
from recovery import env as names
from recovery.python_path import PYTHONPATH, own_pythonpath
from recovery.safe_files import UnsafeFolder, own_subfolder

__all__ = ["SCHEDULER_MODULE", "Role", "ProcessSpec", "Seat", "worker_spec", "scheduler_spec",
           "script_argv", "FORK_SERVER_PROGRAM", "worker_argv", "fork_server_spec",
           "forks_workers", "error_file", "prepare_error_file", "signal_names", "OWN_PYTHON",
           "own_env"]

FORK_SERVER_PROGRAM = Path(__file__).with_name("fork_server_main.py")
SCHEDULER_MODULE = "recovery.control.scheduler"


class Role(str, Enum):
    SCHEDULER = "scheduler"
    WORKER = "worker"
    FORK_SERVER = "fork_server"


@dataclass(frozen=True)
class ProcessSpec:
    role: Role
    rank: int | None
    """A worker's slot; None for the scheduler and the fork server."""
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_path: Path


@dataclass(frozen=True)
class Seat:
    """Where this node's workers sit in one generation: first global rank, world size, the node's place
    and the node count. Fixed, except under an elastic node range (``--nnodes=MIN:MAX``)."""

    first_rank: int
    world_size: int
    group_rank: int
    group_world_size: int


OWN_PYTHON = (sys.executable, "-u", "-P")
"""How tftrun starts its own processes: ``-P`` and :func:`own_env` keep the working folder off
``sys.path``, so a ``recovery/`` there is never run instead (docs/security.md). Not ``-I``: it would drop
``PYTHONPATH`` and the user's site-packages, where tftrun or torch may be installed."""


def own_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for one of tftrun's own processes: ``PYTHONPATH``'s absolute entries only."""
    kept = own_pythonpath(env.get(PYTHONPATH, ""))
    return {**{name: value for name, value in env.items() if name != PYTHONPATH},
            **({PYTHONPATH: kept} if kept else {})}


def _common_env(config: LaunchConfig, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update({
        names.MS_WORKER_NUM: str(config.worker_num),
        names.MS_SCHED_HOST: config.master_addr,
        names.MS_SCHED_PORT: str(config.master_port),
        names.MS_ENABLE_RECOVERY: "1",
        names.MS_RECOVERY_PATH: str(config.recovery_path),
        names.TFT_RUN_ID: config.run_id,
        names.TFT_JOB_EPOCH: config.epoch,
        names.TFT_LOG_DIR: str(config.log_dir),
        names.TFT_JOB_TOKEN: config.job_token,
        names.TFT_IS_RECOVER: "1" if config.is_recover else "0",
        names.TFT_CLUSTER_TIME_OUT: str(config.cluster_time_out),
        names.TFT_REJOIN_COOLDOWN: str(config.rejoin_cooldown),
        names.TFT_HEARTBEAT_TIMEOUT: str(config.heartbeat_timeout),
        names.TFT_PROGRESS_TIMEOUT: str(config.progress_timeout),
        **config.stragglers.to_env(),
        names.MS_TOPO_TIMEOUT: str(config.cluster_time_out),
        names.RANK_SIZE: str(config.worker_num),
        names.TFT_MIN_WORKER_NUM: str(config.min_worker_num),
        names.TFT_BATCH_POLICY: str(config.batch_policy),
    })
    if config.enable_tft is not None:
        env[names.MS_ENABLE_TFT] = config.enable_tft
    if config.lineage:
        env[names.TFT_LINEAGE] = config.lineage
    if config.nnodes is not None:
        env[names.TFT_NODE_NUM] = str(config.nnodes)
    return env


def worker_spec(config: LaunchConfig, local_rank: int, incarnation: int, restart_count: int,
                rendezvous_port: int, base_env: Mapping[str, str] | None = None,
                rendezvous_host: str | None = None, seat: Seat | None = None,
                beat_socket: str | None = None) -> ProcessSpec:
    """The spec of this node's worker ``local_rank`` for one launch, its log and error file named by its
    slot, ``--node_rank × nproc + local_rank``, whatever ``RANK`` an elastic generation gives it.
    ``incarnation`` counts this rank's launches, ``restart_count`` the whole group's (torchrun's count);
    ``env://`` meets at this restart's fresh store on ``rendezvous_port`` of ``rendezvous_host``
    (``--master_addr`` when None); ``seat`` is its generation's ranks (None: the node's fixed seat)."""
    slot = config.first_rank + local_rank
    seat = seat or Seat(config.first_rank, config.worker_num, config.assigned_rank, config.group_world_size)
    rank = seat.first_rank + local_rank
    env = _common_env(config, os.environ if base_env is None else base_env)
    if config.nproc > 1:
        # torchrun's rule: N busy processes on few cores must not each spawn N threads.
        env.setdefault(names.OMP_NUM_THREADS, "1")
    env.setdefault(names.TORCH_NCCL_ASYNC_ERROR_HANDLING, "1")  # torchrun's value, unless the user set one
    env.update({
        names.RANK: str(rank),
        names.LOCAL_RANK: str(local_rank),
        names.WORLD_SIZE: str(seat.world_size),
        names.LOCAL_WORLD_SIZE: str(config.nproc),
        names.GROUP_RANK: str(seat.group_rank),
        names.GROUP_WORLD_SIZE: str(seat.group_world_size),
        names.ROLE_NAME: config.role,
        names.ROLE_RANK: str(rank),
        names.ROLE_WORLD_SIZE: str(seat.world_size),
        names.MASTER_ADDR: rendezvous_host or config.master_addr,
        names.MASTER_PORT: str(rendezvous_port),
        names.TORCHELASTIC_USE_AGENT_STORE: str(True),
        names.TORCHELASTIC_RESTART_COUNT: str(restart_count),
        names.TORCHELASTIC_MAX_RESTARTS: str(config.max_restarts),
        names.TORCHELASTIC_RUN_ID: config.job_id or config.run_id,
        names.TORCHELASTIC_ERROR_FILE: str(error_file(config, slot)),
        names.TORCHELASTIC_SIGNALS_TO_HANDLE: signal_names(config.signals_to_handle),
        names.RANK_ID: str(rank),
        names.DEVICE_ID: str(local_rank),
        names.MS_ROLE: names.ROLE_WORKER,
        names.MS_NODE_ID: str(slot),
        names.TFT_INCARNATION: str(incarnation),
        names.TFT_RESTART_COUNT: str(restart_count),
    })
    if seat.world_size != config.worker_num:
        env[names.MS_WORKER_NUM] = env[names.RANK_SIZE] = str(seat.world_size)
    if beat_socket is not None:
        env[names.TFT_BEAT_SOCKET] = beat_socket
    return ProcessSpec(Role.WORKER, slot, worker_argv(config, env), env, config.worker_log(slot))


def scheduler_spec(config: LaunchConfig, listen_fd: int) -> ProcessSpec:
    """The scheduler, serving the cluster store on the inherited socket ``listen_fd``."""
    env = _common_env(config, os.environ)
    env.update({names.MS_ROLE: names.ROLE_SCHEDULER, names.TFT_STORE_FD: str(listen_fd)})
    argv = (*OWN_PYTHON, "-m", SCHEDULER_MODULE)
    return ProcessSpec(Role.SCHEDULER, None, argv, own_env(env), config.log_dir / "scheduler.log")


TITLE_ROOM = 4096
"""Bytes of padding in the fork server's command line: the room a forked worker has to show its own."""
ENVIRON_ROOM = 100_000
"""Bytes of padding in the fork server's environment: the room a forked process has to show its own;
under Linux's 128 KiB limit on one variable."""


def forks_workers(config: LaunchConfig) -> bool:
    """Whether this node's workers are forked from a fork server: ``--fork_server`` on, a Python script or
    module, and no ``PYTHON_EXEC`` naming another Python."""
    python = os.environ.get(names.PYTHON_EXEC)
    return (config.fork_server and config.entry in ("script", "module")
            and python in (None, "", sys.executable))


def fork_server_spec(config: LaunchConfig, sock_fd: int, supervisor_pid: int) -> ProcessSpec:
    """The fork server, serving on the inherited socket ``sock_fd``. It gets a worker's environment, so what
    torch reads at import (e.g. ``OMP_NUM_THREADS``) is what a worker would read."""
    env = {**own_env(worker_spec(config, 0, 0, 0, 0).env), names.TFT_ENVIRON_ROOM: " " * ENVIRON_ROOM}
    if config.entry == "script":
        env[names.TFT_PRELOAD] = framework_imports(config.script)
    argv = (*OWN_PYTHON, str(FORK_SERVER_PROGRAM), FORK_SERVER, str(sock_fd),
            str(supervisor_pid), " " * TITLE_ROOM)
    return ProcessSpec(Role.FORK_SERVER, None, argv, env, config.log_dir / "fork_server.log")


def script_argv(config: LaunchConfig) -> tuple[str, ...]:
    """The worker's script and its arguments (``sys.argv`` in the worker)."""
    return (str(config.script), *config.script_args)


def worker_argv(config: LaunchConfig, env: Mapping[str, str]) -> tuple[str, ...]:
    """The worker's command line, as torchrun builds it; the Python is ``PYTHON_EXEC`` when set."""
    if config.entry == "exec":
        return script_argv(config)
    python = env.get(names.PYTHON_EXEC) or sys.executable
    module = ("-m",) if config.entry == "module" else ()
    return (python, "-u", *module, *script_argv(config))


def signal_names(numbers: tuple[int, ...]) -> str:
    """``TORCHELASTIC_SIGNALS_TO_HANDLE``'s spelling: ``SIGTERM,SIGINT,...``."""
    return ",".join(signal.Signals(number).name for number in numbers)


def error_file(config: LaunchConfig, rank: int) -> Path:
    """Where torch's ``@record`` in worker ``rank`` writes its root-cause JSON."""
    return config.log_dir / "errors" / f"worker_{rank}.json"


def prepare_error_file(config: LaunchConfig, rank: int) -> None:
    """Before a launch of ``rank``: make and check its error file's folder (``@record`` writes without
    ``O_NOFOLLOW``; OSError when it is not the user's own) and remove an earlier launch's file."""
    path = error_file(config, rank)
    try:
        own_subfolder(path.parent)
    except UnsafeFolder as err:
        raise OSError(f"{path.parent}: {err}") from None
    path.unlink(missing_ok=True)
