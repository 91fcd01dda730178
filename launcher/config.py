"""LaunchConfig: everything one ``tftrun`` invocation was asked to do, checked up front by
``validate()`` before anything is started; each problem is a ConfigError (one line, exit 2)."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from launcher.errors import ConfigError
from recovery import env as names
from recovery.control.node_range import DEFAULT_LAST_CALL, NodeRange
from recovery.control.rpc import describe_bind_error, listen_on
from recovery.control.stragglers import StragglerSettings
from recovery.safe_files import UnsafeFolder, resolved_folder
from recovery.timeouts import (
    DEFAULT_CLUSTER_TIME_OUT,
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_PROGRESS_TIMEOUT,
    DEFAULT_REJOIN_COOLDOWN,
)
from recovery.train.modes import parse_enable_tft
from recovery.train.shares import BatchPolicy

__all__ = ["LaunchConfig", "bind_listener", "RestartPolicy", "DEFAULT_PROGRESS_INTERVAL",
           "AUTO_NODE_RANK", "with_node_rank", "DEFAULT_SIGNALS", "ENTRY_KINDS",
           "DEFAULT_MASTER_PORT", "DEFAULT_WORKER_LOG_NAME", "check_own_folder", "with_own_folders"]

ENTRY_KINDS = ("script", "module", "exec")
"""What ``script`` names: a Python file, a module (``-m``), an executable (``--no_python``)."""
DEFAULT_MASTER_PORT = 0
"""No ``--master_port``: a free port, picked and printed (torchrun's ``--standalone``); a job of
several nodes must give one (docs/from-torchrun.md)."""
DEFAULT_WORKER_LOG_NAME = "worker"
"""msrun's ``--worker_log_name``: worker ``r`` logs to ``<log_dir>/worker_<r>.log``."""
WORKER_LOG_FIELDS = ("ip", "hostname")
"""What a ``--worker_log_name`` may name in braces, as msrun's does: ``{ip}``, ``{hostname}``."""


class RestartPolicy(StrEnum):
    """What a worker's failure restarts (``--restart_policy``)."""

    AUTO = "auto"
    """``rank`` for workers that registered with the scheduler, else ``all``."""
    ALL = "all"
    """torchrun's restart of every worker."""
    RANK = "rank"
    """Relaunch only the dead ranks (the survivors recover in-process through ``recovery``)."""


DEFAULT_PROGRESS_INTERVAL = 10.0
"""Off a terminal, seconds between two progress lines."""
DEFAULT_MIN_WORKER_NUM = 1
"""``--min_worker_num`` when not given: degraded training is on by default, for scripts whose ranks register
(docs/recovery.md)."""
DEFAULT_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                                    signal.SIGUSR1, signal.SIGUSR2)
"""The signals that stop the job in order (``--signals_to_handle``): torchrun's four and
Slurm's usual preemption warnings."""


@dataclass(frozen=True)
class LaunchConfig:
    script: Path
    script_args: tuple[str, ...] = ()
    worker_num: int = 1
    local_worker_num: int | None = None
    min_worker_num: int = None  # type: ignore[assignment]  # not given: set by __post_init__
    """The fewest workers the job trains on while ranks are missing (docs/elastic.md). Not given:
    :data:`DEFAULT_MIN_WORKER_NUM`, but ``worker_num`` under an elastic node range, whose rounds decide the
    job's size. ``worker_num`` means a dead rank pauses the others until it is back (the bitwise guarantee)."""
    batch_policy: BatchPolicy = BatchPolicy.CONSTANT
    """What a step trains while ranks are missing (the workers' ``TFT_BATCH_POLICY``). A
    string is taken for its value; one that names none is refused by :meth:`validate`."""
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    node_rank: int | None = 0
    """None: not given; node 0's scheduler assigns it (:func:`with_node_rank`)."""
    nnodes: int | None = None
    """The job's node count; MAX of an elastic range ``--nnodes=MIN:MAX``."""
    min_nnodes: int | None = None
    """MIN of ``--nnodes=MIN:MAX`` (None: not given); below ``nnodes``, the job is elastic
    (recovery/control/node_range.py)."""
    last_call: float = DEFAULT_LAST_CALL
    """Seconds an elastic job's restart with MIN nodes waits for more (``--rdzv_conf
    last_call_timeout``)."""
    node_addr: str = ""
    """This node's address: its workers' and its rendezvous stores' (empty: master_addr)."""
    node_id: str = ""
    """This node's name for automatic node ranks (empty: its host name and node address)."""
    log_dir: Path = Path("logs")
    join: bool = False
    cluster_time_out: float = DEFAULT_CLUSTER_TIME_OUT
    node_time_out: float = DEFAULT_CLUSTER_TIME_OUT
    """Seconds a lost node may take to come back (launcher/supervisor/loop.py, NodeWatch)."""
    max_restarts: int = 3
    rejoin_cooldown: float = DEFAULT_REJOIN_COOLDOWN
    rejoin_timeout: float = None  # type: ignore[assignment]  # not given: set by __post_init__
    """Seconds a dead rank may take to register again before it is retired, with ``min_worker_num`` below
    ``worker_num``. Not given: the cooldown plus torchrun's last call, as long as torchrun's rendezvous waits
    for a late node once enough are there."""
    monitor_interval: float = 0.1
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    progress_timeout: float = DEFAULT_PROGRESS_TIMEOUT
    stragglers: StragglerSettings = StragglerSettings()
    grace_period: float = 10.0
    restart_policy: RestartPolicy = RestartPolicy.AUTO
    """A string is taken for its value (the CLI's); one that names none is refused by
    :meth:`validate`."""
    is_recover: bool = False
    recovery_path: Path = Path("tft_recovery")
    enable_tft: str | None = None
    fork_server: bool = True
    """Fork this node's workers from a warm interpreter that imported torch once
    (launcher/procs/fork_server.py); False: every worker is a fresh process."""
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL
    """Off a terminal, seconds between two progress lines (0: none)."""
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3))
    job_token: str = field(
        default_factory=lambda: os.environ.get(names.TFT_JOB_TOKEN) or secrets.token_hex(16),
        repr=False)
    """The key of the control plane's signatures: the same on every node of a job, so a
    multi-node job takes it from TFT_JOB_TOKEN; a new random one otherwise."""
    epoch: str = field(default_factory=lambda: secrets.token_hex(16))
    """This launch's epoch (``TFT_JOB_EPOCH``): random, except where a node joins or returns to node 0's
    launch (launcher/nodes/job.py)."""
    lineage: str = ""
    """The job's lineage id (recovery/ckpt/lineage.py), set once the recovery path is opened."""
    entry: str = "script"
    """One of :data:`ENTRY_KINDS`: how a worker runs ``script``."""
    role: str = "default"
    """torchrun's ``--role``: the workers' ``ROLE_NAME``."""
    job_id: str = ""
    """torchrun's ``--rdzv_id``: the workers' ``TORCHELASTIC_RUN_ID`` (empty: ``run_id``)."""
    signals_to_handle: tuple[int, ...] = DEFAULT_SIGNALS
    """Signals to tftrun that stop the job in order: passed on to the workers, then the
    grace period, then SIGKILL; tftrun exits 128+N (launcher/supervisor/signals.py)."""
    console_ranks: frozenset[int] | None = None
    """With ``join``: the local ranks whose output is shown (None: all)."""
    worker_log_name: str = DEFAULT_WORKER_LOG_NAME
    """msrun's ``--worker_log_name``: the stem of each worker's log (:meth:`worker_log`)."""
    bind_core: bool = False
    """msrun's ``--bind_core``: pin each worker to its share of this node's cores
    (launcher/procs/cores.py)."""

    def __post_init__(self) -> None:
        if self.min_worker_num is None:
            fewest = self.worker_num if self.node_range is not None else min(
                DEFAULT_MIN_WORKER_NUM, self.worker_num)
            object.__setattr__(self, "min_worker_num", fewest)
        if self.rejoin_timeout is None:
            object.__setattr__(self, "rejoin_timeout", self.rejoin_cooldown + DEFAULT_LAST_CALL)
        for name, kind in (("restart_policy", RestartPolicy), ("batch_policy", BatchPolicy)):
            if getattr(self, name) in kind.__members__.values():
                object.__setattr__(self, name, kind(getattr(self, name)))

    @property
    def trains_degraded(self) -> bool:
        """Whether the survivors of a death train on without the dead ranks (for scripts whose ranks register)."""
        return self.min_worker_num < self.worker_num

    @property
    def nproc(self) -> int:
        """Workers on this node."""
        return self.worker_num if self.local_worker_num is None else self.local_worker_num

    @property
    def first_rank(self) -> int:
        return self.assigned_rank * self.nproc

    @property
    def assigned_rank(self) -> int:
        """The node rank, once known (see :func:`with_node_rank`)."""
        if self.node_rank is None:
            raise RuntimeError("the node rank is not assigned yet")
        return self.node_rank

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
    def node_range(self) -> NodeRange | None:
        """``--nnodes=MIN:MAX`` with MIN < MAX (None: a fixed node count)."""
        if self.min_nnodes is None or self.nnodes is None or self.min_nnodes >= self.nnodes:
            return None
        return NodeRange(self.min_nnodes, self.nnodes)

    @property
    def local_addr(self) -> str:
        return self.node_addr or self.master_addr

    @property
    def group_world_size(self) -> int:
        """Nodes in the job (torchrun's ``GROUP_WORLD_SIZE``)."""
        return -(-self.worker_num // self.nproc)

    def worker_log(self, slot: int) -> Path:
        """Worker ``slot``'s log: ``<log_dir>/<worker_log_name>_<slot>.log``, msrun's name, with
        ``{ip}`` (this node's address) and ``{hostname}`` filled in."""
        return self.log_dir / f"{self._worker_log_stem()}_{slot}.log"

    @property
    def worker_log_glob(self) -> str:
        """The pattern that every worker's log of this node matches (in ``log_dir``)."""
        return f"{glob.escape(self._worker_log_stem())}_*.log"

    def _worker_log_stem(self) -> str:
        return self.worker_log_name.format(ip=self.local_addr, hostname=socket.gethostname())

    def shows_output(self, rank: int | None) -> bool:
        """Whether the console streams this process's log (``rank`` None: the scheduler)."""
        if not self.join:
            return False
        if self.console_ranks is None:
            return True
        return rank is not None and rank - self.first_rank in self.console_ranks

    def validate(self) -> None:
        """Raise ConfigError for the first problem found; touch nothing but the log dir."""
        if self.worker_num < 1:
            raise ConfigError(f"--worker_num must be at least 1, got {self.worker_num}")
        if self.nproc < 1:
            raise ConfigError(f"--local_worker_num must be at least 1, got {self.nproc}")
        if self.nproc > self.worker_num:
            raise ConfigError(
                f"--local_worker_num={self.nproc} is more than --worker_num={self.worker_num}")
        if not 1 <= self.min_worker_num <= self.worker_num:
            raise ConfigError(f"--min_worker_num must be in 1..--worker_num={self.worker_num}, "
                              f"got {self.min_worker_num}")
        if self.node_rank is not None:
            self.check_node_rank()
        if (self.nnodes is not None and self.local_worker_num is not None
                and self.worker_num != self.nnodes * self.nproc):
            raise ConfigError(f"--worker_num={self.worker_num} is not --nnodes={self.nnodes} x "
                              f"--nproc_per_node={self.nproc}")
        if not 0 <= self.master_port <= 65535:
            raise ConfigError(f"--master_port must be in 0..65535, got {self.master_port}")
        if self.master_port == 0 and self.multi_node:
            raise ConfigError(f"a job of several nodes needs --master_port, the same on every node (node 0's "
                              f"scheduler listens there; none or 0 picks a free port on one node only), e.g. "
                              f"--master_port=29500; {self.nproc} of --worker_num={self.worker_num} workers run here")
        for name, value in (("--max_restarts", self.max_restarts),
                            ("--rejoin_cooldown", self.rejoin_cooldown),
                            ("--progress_interval", self.progress_interval)):
            if value is not None and value < 0:
                raise ConfigError(f"{name} must not be negative, got {value}")
        if self.cluster_time_out <= 0:
            raise ConfigError(f"--cluster_time_out must be positive, got {self.cluster_time_out:g} "
                              "(msrun's negative 'wait forever' is not supported: give seconds)")
        for name, value in (("--monitor_interval", self.monitor_interval),
                            ("--heartbeat_timeout", self.heartbeat_timeout),
                            ("--progress_timeout", self.progress_timeout),
                            ("--grace_period", self.grace_period),
                            ("--node_time_out", self.node_time_out),
                            ("--rejoin_timeout", self.rejoin_timeout)):
            if value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        if (problem := self.stragglers.problem()) is not None:
            raise ConfigError(problem)
        if self.last_call < 0:
            raise ConfigError(f"--rdzv_conf last_call_timeout must not be negative, got "
                              f"{self.last_call:g}")
        if self.node_range is not None and self.restart_policy is RestartPolicy.RANK:
            raise ConfigError(f"--nnodes={self.min_nnodes}:{self.nnodes} restarts every worker "
                              "at each change of nodes (torchrun's way); --restart_policy=rank "
                              "cannot keep them: give --restart_policy=auto or all")
        for name, value, kind in (("--restart_policy", self.restart_policy, RestartPolicy),
                                  ("--batch_policy", self.batch_policy, BatchPolicy)):
            if not isinstance(value, kind):
                raise ConfigError(f"{name} must be one of {', '.join(p.value for p in kind)}, got {value!r}")
        self._check_worker_log_name()
        self._check_enable_tft()
        self._check_script()
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.log_dir):
                pass
        except OSError as err:
            raise ConfigError(f"--log_dir {self.log_dir} is not writable: {err.strerror}") from None
        check_own_folder(self.log_dir, "--log_dir")

    def check_node_rank(self) -> None:
        """ConfigError unless the node rank fits the job: given, or assigned by node 0."""
        rank = self.assigned_rank
        if rank < 0:
            raise ConfigError(f"--node_rank must be at least 0, or {AUTO_NODE_RANK} (node 0's "
                              f"scheduler assigns it), got {rank}")
        if self.first_rank + self.nproc > self.worker_num:
            raise ConfigError(
                f"--node_rank={rank} with {self.nproc} workers per node does not fit "
                f"in --worker_num={self.worker_num}")
        if self.nnodes is not None and not 0 <= rank < self.nnodes:
            raise ConfigError(f"--node_rank={rank} is not below --nnodes={self.nnodes}")

    def _check_worker_log_name(self) -> None:
        """A file name in ``log_dir``, naming no field but :data:`WORKER_LOG_FIELDS`."""
        name = self.worker_log_name
        try:
            stem = name.format(**dict.fromkeys(WORKER_LOG_FIELDS, "x"))
        except (KeyError, IndexError, ValueError):
            raise ConfigError(f"--worker_log_name={name}: braces may name only "
                              f"{', '.join('{' + f + '}' for f in WORKER_LOG_FIELDS)}") from None
        if not stem or "/" in stem or stem in (".", ".."):
            raise ConfigError(f"--worker_log_name={name!r}: give a file name (no '/'), e.g. "
                              "worker_{hostname}")

    def _check_enable_tft(self) -> None:
        """The modes must parse, whether given by --enable_tft or inherited MS_ENABLE_TFT."""
        given = self.enable_tft if self.enable_tft is not None else os.environ.get(names.MS_ENABLE_TFT)
        try:
            parse_enable_tft(given)
        except ValueError as err:
            source = "--enable_tft" if self.enable_tft is not None else names.MS_ENABLE_TFT
            raise ConfigError(f"{source}: {err}") from None

    def _check_script(self) -> None:
        if self.entry == "module":
            return  # a module is found by the worker's Python, on its path
        if self.entry == "exec":
            if shutil.which(str(self.script)) is None:
                raise ConfigError(f"--no_python: {self.script} is not an executable file or "
                                  "a command on PATH")
            return
        if not self.script.exists():
            raise ConfigError(f"script not found: {self.script}")
        if not self.script.is_file():
            raise ConfigError(f"script is not a file: {self.script}")
        if not os.access(self.script, os.R_OK):
            raise ConfigError(f"script is not readable: {self.script}")


def check_own_folder(directory: Path, option: str) -> Path:
    """``directory`` resolved; ConfigError unless it is the user's own, on a path nobody else can change
    (recovery/safe_files.py)."""
    try:
        return resolved_folder(directory)
    except UnsafeFolder as err:
        raise ConfigError(f"{option} {directory}: {err}") from None


def with_own_folders(config: LaunchConfig) -> LaunchConfig:
    """``config`` with its log dir and recovery path made, checked and resolved once, for every process of the
    node."""
    try:
        config.recovery_path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--recovery_path {config.recovery_path} is not writable: "
                          f"{err.strerror}") from None
    return replace(config, log_dir=check_own_folder(config.log_dir, "--log_dir"),
                   recovery_path=check_own_folder(config.recovery_path, "--recovery_path"))


AUTO_NODE_RANK = -1
"""msrun's ``--node_rank`` default: node 0's scheduler assigns the rank."""


def with_node_rank(config: LaunchConfig, node_rank: int) -> LaunchConfig:
    """``config`` with the node rank assigned by node 0 (launcher/nodes/ranks.py), checked as a given one is."""
    placed = replace(config, node_rank=node_rank)
    placed.check_node_rank()
    return placed


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind and listen on ``host:port`` (0 picks a free port); ConfigError if taken. The supervisor binds it
    and hands the socket down, so "port in use" shows before anything starts and a relaunched scheduler
    keeps the port."""
    try:
        return listen_on(host, port)
    except OSError as err:
        raise ConfigError(f"--master_port {port} on {host}: {describe_bind_error(err)}") from None
