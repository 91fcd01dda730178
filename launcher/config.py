"""LaunchConfig: everything one ``tftrun`` invocation was asked to do, checked up front.

``validate()`` runs before anything is started; each problem is a ConfigError (one line,
exit status 2).
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher.errors import ConfigError
from recovery.safe_files import folder_problem
from recovery.control.rpc import describe_bind_error, listen_on
from recovery import env as names
from recovery.train.modes import parse_enable_tft
from recovery.timeouts import (
    DEFAULT_CLUSTER_TIME_OUT, DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_PROGRESS_TIMEOUT,
    DEFAULT_REJOIN_COOLDOWN,
)

__all__ = ["LaunchConfig", "bind_listener", "RESTART_POLICIES", "DEFAULT_PROGRESS_INTERVAL"]

RESTART_POLICIES = ("auto", "all", "rank")
DEFAULT_PROGRESS_INTERVAL = 30.0
"""Off a terminal, seconds between two progress lines."""
"""``all``: torchrun's restart of every worker; ``rank``: relaunch only the dead ranks
(the survivors recover in-process through ``recovery``); ``auto``: ``rank`` for workers
that registered with the scheduler, else ``all``."""


@dataclass(frozen=True)
class LaunchConfig:
    script: Path
    script_args: tuple[str, ...] = ()
    worker_num: int = 8
    local_worker_num: int | None = None
    master_addr: str = "127.0.0.1"
    master_port: int = 8118
    node_rank: int = 0
    nnodes: int | None = None
    node_addr: str = ""
    """This node's address: its workers' and its rendezvous stores' (empty: master_addr)."""
    log_dir: Path = Path("logs")
    join: bool = False
    cluster_time_out: float = DEFAULT_CLUSTER_TIME_OUT
    node_time_out: float = DEFAULT_CLUSTER_TIME_OUT
    """Seconds a lost node may take to come back (launcher/supervisor/loop.py, NodeWatch)."""
    max_restarts: int = 3
    rejoin_cooldown: float = DEFAULT_REJOIN_COOLDOWN
    monitor_interval: float = 0.1
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    progress_timeout: float = DEFAULT_PROGRESS_TIMEOUT
    grace_period: float = 10.0
    restart_policy: str = "auto"
    is_recover: bool = False
    recovery_path: Path = Path("tft_recovery")
    enable_tft: str | None = None
    warm_spare: int | None = None
    """Spare processes kept warm on this node for relaunched ranks (launcher/procs/spare_pool.py);
    None (the default): one, once a worker of this node registers with the scheduler (its
    script uses recovery, so a dead rank is relaunched alone) and unless
    ``--restart_policy=all``; 0: none."""
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL
    """Off a terminal, seconds between two progress lines (0: none)."""
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3))
    job_token: str = field(
        default_factory=lambda: os.environ.get(names.TFT_JOB_TOKEN) or secrets.token_hex(16),
        repr=False)
    """The key of the control plane's signatures: the same on every node of a job, so a
    multi-node job takes it from TFT_JOB_TOKEN; a new random one otherwise."""
    lineage: str = ""
    """The job's lineage id (recovery/ckpt/lineage.py), set once the recovery path is opened."""

    @property
    def nproc(self) -> int:
        """Workers on this node."""
        return self.worker_num if self.local_worker_num is None else self.local_worker_num

    @property
    def first_rank(self) -> int:
        return self.node_rank * self.nproc

    @property
    def hosts_scheduler(self) -> bool:
        return self.node_rank == 0

    @property
    def multi_node(self) -> bool:
        """Other nodes run workers of this job (each with its own tftrun)."""
        return self.nproc < self.worker_num

    @property
    def node_title(self) -> str:
        """Which node this is, for the live view: ``tftrun`` on one node, else e.g.
        ``tftrun: node 1 (10.0.0.2), ranks 4-7 of 8``."""
        if not self.multi_node:
            return "tftrun"
        return (f"tftrun: node {self.node_rank} ({self.local_addr}), ranks {self.first_rank}-"
                f"{self.first_rank + self.nproc - 1} of {self.worker_num}")

    @property
    def local_addr(self) -> str:
        return self.node_addr or self.master_addr

    def validate(self) -> None:
        """Raise ConfigError for the first problem found; touch nothing but the log dir."""
        if self.worker_num < 1:
            raise ConfigError(f"--worker_num must be at least 1, got {self.worker_num}")
        if self.nproc < 1:
            raise ConfigError(f"--local_worker_num must be at least 1, got {self.nproc}")
        if self.nproc > self.worker_num:
            raise ConfigError(
                f"--local_worker_num={self.nproc} is more than --worker_num={self.worker_num}")
        if self.node_rank < 0 or self.first_rank + self.nproc > self.worker_num:
            raise ConfigError(
                f"--node_rank={self.node_rank} with {self.nproc} workers per node does not fit "
                f"in --worker_num={self.worker_num}")
        if self.nnodes is not None and not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"--node_rank={self.node_rank} is not below --nnodes={self.nnodes}")
        if (self.nnodes is not None and self.local_worker_num is not None
                and self.worker_num != self.nnodes * self.nproc):
            raise ConfigError(f"--worker_num={self.worker_num} is not --nnodes={self.nnodes} x "
                              f"--nproc_per_node={self.nproc}")
        if not 1 <= self.master_port <= 65535:
            raise ConfigError(f"--master_port must be in 1..65535, got {self.master_port}")
        for name, value in (("--max_restarts", self.max_restarts),
                            ("--rejoin_cooldown", self.rejoin_cooldown),
                            ("--warm_spare", self.warm_spare),
                            ("--progress_interval", self.progress_interval)):
            if value is not None and value < 0:
                raise ConfigError(f"{name} must not be negative, got {value}")
        for name, value in (("--monitor_interval", self.monitor_interval),
                            ("--heartbeat_timeout", self.heartbeat_timeout),
                            ("--progress_timeout", self.progress_timeout),
                            ("--grace_period", self.grace_period),
                            ("--node_time_out", self.node_time_out)):
            if value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        if self.restart_policy not in RESTART_POLICIES:
            raise ConfigError(f"--restart_policy must be one of {', '.join(RESTART_POLICIES)}, "
                              f"got {self.restart_policy!r}")
        self._check_enable_tft()
        self._check_script()
        self._check_writable(self.log_dir, "--log_dir")

    def _check_enable_tft(self) -> None:
        """The modes must parse, whether given by --enable_tft or inherited MS_ENABLE_TFT."""
        given = self.enable_tft if self.enable_tft is not None else os.environ.get(names.MS_ENABLE_TFT)
        try:
            parse_enable_tft(given)
        except ValueError as err:
            source = "--enable_tft" if self.enable_tft is not None else names.MS_ENABLE_TFT
            raise ConfigError(f"{source}: {err}") from None

    def _check_script(self) -> None:
        if not self.script.exists():
            raise ConfigError(f"script not found: {self.script}")
        if not self.script.is_file():
            raise ConfigError(f"script is not a file: {self.script}")
        if not os.access(self.script, os.R_OK):
            raise ConfigError(f"script is not readable: {self.script}")

    @staticmethod
    def _check_writable(directory: Path, option: str) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as err:
            raise ConfigError(f"{option} {directory} is not writable: {err.strerror}") from None
        check_own_folder(directory, option)


def check_own_folder(directory: Path, option: str) -> None:
    """ConfigError (one line) unless ``directory`` is the user's own and writable by
    nobody else (recovery/safe_files.py)."""
    problem = folder_problem(directory)
    if problem is not None:
        raise ConfigError(f"{option} {directory}: {problem}")


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind and listen on ``host:port`` (0 picks a free port); ConfigError if taken.

    The supervisor binds the scheduler's port itself and hands the socket down, so that
    "port in use" is found before anything starts and a relaunched scheduler gets the
    very same port back at once.
    """
    try:
        return listen_on(host, port)
    except OSError as err:
        raise ConfigError(f"--master_port {port} on {host}: {describe_bind_error(err)}") from None
