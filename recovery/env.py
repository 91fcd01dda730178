"""The env contract between the launcher and a worker (docs/env.md): the one module that spells
env names, torchrun's, msrun's ``MS_*`` and tftrun's ``TFT_*``; others import its constants."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "WorkerEnv",
    "ROLE_WORKER",
    "ROLE_SCHEDULER",
]

# torchrun-compatible.
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
ROLE_RANK = "ROLE_RANK"
ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
TORCHELASTIC_SIGNALS_TO_HANDLE = "TORCHELASTIC_SIGNALS_TO_HANDLE"
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
ROLE_NAME = "ROLE_NAME"
TORCH_NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
OMP_NUM_THREADS = "OMP_NUM_THREADS"
PYTHON_EXEC = "PYTHON_EXEC"
"""Read, as torchrun does: the interpreter a worker's script runs with (default: tftrun's)."""

# Read, never set: torchrun's defaults for its options, as Kubeflow's PyTorchJob passes them
# (``PET_<OPTION>``, e.g. PET_NNODES for --nnodes; launcher/cli/tftrun.py).
PET_PREFIX = "PET_"


def pet(option: str) -> str:
    """torchrun's variable for ``--option`` (``nproc_per_node`` → ``PET_NPROC_PER_NODE``)."""
    return PET_PREFIX + option.upper()

# msrun-compatible.
MS_ROLE = "MS_ROLE"
MS_NODE_ID = "MS_NODE_ID"
MS_WORKER_NUM = "MS_WORKER_NUM"
MS_SCHED_HOST = "MS_SCHED_HOST"
MS_SCHED_PORT = "MS_SCHED_PORT"
MS_ENABLE_RECOVERY = "MS_ENABLE_RECOVERY"
MS_RECOVERY_PATH = "MS_RECOVERY_PATH"
MS_ENABLE_TFT = "MS_ENABLE_TFT"
MS_TOPO_TIMEOUT = "MS_TOPO_TIMEOUT"
RANK_ID = "RANK_ID"
"""msrun's name for the worker's global rank (MindSpore's rank-table scripts read it)."""
DEVICE_ID = "DEVICE_ID"
"""msrun's name for the worker's index on its node (its device)."""
RANK_SIZE = "RANK_SIZE"

ROLE_WORKER = "MS_WORKER"
ROLE_SCHEDULER = "MS_SCHED"

# tftrun's own.
TFT_RUN_ID = "TFT_RUN_ID"
TFT_INCARNATION = "TFT_INCARNATION"
TFT_RESTART_COUNT = "TFT_RESTART_COUNT"
TFT_LOG_DIR = "TFT_LOG_DIR"
TFT_IS_RECOVER = "TFT_IS_RECOVER"
TFT_JOB_TOKEN = "TFT_JOB_TOKEN"
"""The job's secret: the key of every request's and reply's signature (control/signing.py)."""
TFT_INSECURE_NO_TOKEN = "TFT_INSECURE_NO_TOKEN"
"""Set to 1 to run with an empty job token: no authentication at all (docs/security.md)."""
TFT_JOB_EPOCH = "TFT_JOB_EPOCH"
"""The launch's random epoch, part of the job's signing key, so that nothing signed in an
earlier launch verifies in this one (recovery/control/signing.py ``job_key``)."""
TFT_NODE_NUM = "TFT_NODE_NUM"
"""The job's node count (``--nnodes``), when given; the scheduler signs it into ``tft/job``."""
TFT_INSECURE_WEAK_TOKEN = "TFT_INSECURE_WEAK_TOKEN"
"""Set to 1 to accept a user-set job token shorter than 128 bits (docs/security.md)."""
TFT_TOKEN_FILE = "TFT_TOKEN_FILE"
"""templates/run.sh and recover.sh only: where the job token they made is kept (mode 0600)."""
TFT_CLUSTER_TIME_OUT = "TFT_CLUSTER_TIME_OUT"
TFT_REJOIN_COOLDOWN = "TFT_REJOIN_COOLDOWN"
TFT_MIN_WORKER_NUM = "TFT_MIN_WORKER_NUM"
"""``--min_worker_num`` (docs/elastic.md); unset: ``worker_num`` (no degraded training)."""
TFT_BATCH_POLICY = "TFT_BATCH_POLICY"
"""What a degraded step trains: ``constant`` (default) or ``shrink`` (docs/elastic.md)."""
TFT_REPLAY_MEMBERSHIP = "TFT_REPLAY_MEMBERSHIP"
"""An earlier run's ``events.jsonl`` (or its log dir) whose membership changes are made again
at the same steps (recovery/train/replay.py); read by ``ElasticTrainer``, never set by tftrun."""
TFT_HEARTBEAT_TIMEOUT = "TFT_HEARTBEAT_TIMEOUT"
TFT_PROGRESS_TIMEOUT = "TFT_PROGRESS_TIMEOUT"
TFT_STRAGGLER_FACTOR = "TFT_STRAGGLER_FACTOR"
TFT_STRAGGLER_WINDOW = "TFT_STRAGGLER_WINDOW"
TFT_STRAGGLER_POLICY = "TFT_STRAGGLER_POLICY"
"""``--straggler_factor``, ``--straggler_window`` (the scheduler's and each rank's) and
``--straggler_policy`` (the scheduler's; docs/stragglers.md)."""
TFT_LINEAGE = "TFT_LINEAGE"
"""The job's lineage id (recovery/ckpt/lineage.py): the checkpoints this job may restore."""
TFT_STORE_FD = "TFT_STORE_FD"
"""Set for the scheduler only: an inherited listening socket to host the store on."""
TFT_BEAT_SOCKET = "TFT_BEAT_SOCKET"
"""The Unix socket of the node's supervisor, which beats once for the node's workers
(recovery/control/node_beats.py); unset: each rank beats to the scheduler itself."""
TFT_PRELOAD = "TFT_PRELOAD"
"""Set for the fork server only: the frameworks it imports before forking
(launcher/procs/preload.py)."""
TFT_ENVIRON_ROOM = "TFT_ENVIRON_ROOM"
"""Set for the fork server only: blanks that leave room for each forked process to show its
own environment in ``/proc/<pid>/environ`` (launcher/procs/fork_server_main.py)."""

# Read, never set: what a cluster manager tells tftrun itself about its node
# (launcher/nodes/cluster_env.py; docs/multi-node.md#slurm-and-kubernetes).
SLURM_STEP_ID = "SLURM_STEP_ID"
"""Set inside an ``srun`` step only: tftrun reads Slurm's placement only there."""
SLURM_PROCID = "SLURM_PROCID"
SLURM_NTASKS = "SLURM_NTASKS"
SLURM_STEP_NUM_NODES = "SLURM_STEP_NUM_NODES"
SLURM_STEP_NODELIST = "SLURM_STEP_NODELIST"
SLURM_JOB_NODELIST = "SLURM_JOB_NODELIST"
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
"""A Kubernetes indexed Job's pod index."""

# Data for the templates (msrun's sample scripts use the same name).
DATA_PATH = "DATA_PATH"

# Not "./recovery": run from this repository that would be the library package itself.
DEFAULT_RECOVERY_PATH = "./tft_recovery"
DEFAULT_RUN_ID = "none"
"""The run id of a process started without one (by hand, without TFT_RUN_ID)."""


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class WorkerEnv:
    """What a process started by tftrun (or by hand, msrun-style) learns from its env; fields
    fall back to torchrun's names, then msrun's, then a single-process default, so that the
    same script runs under tftrun, torchrun, msrun-style scripts and alone."""

    role: str
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    node_id: str
    master_addr: str
    master_port: int
    sched_host: str
    sched_port: int
    restart_count: int
    max_restarts: int
    run_id: str
    incarnation: int
    log_dir: str | None
    is_recover: bool
    job_token: str = field(repr=False)
    insecure_no_token: bool
    recovery_path: str
    enable_tft: str
    lineage: str
    """The launcher's lineage id (recovery/ckpt/lineage.py); empty when started without tftrun."""
    min_worker_num: int
    """The fewest workers a generation may have (``world_size`` unless set)."""
    batch_policy: str
    """``constant`` or ``shrink`` (recovery/train/shares.py); empty when not set."""
    replay_membership: str = ""
    """The recorded run whose membership changes to make again; empty: none."""
    epoch: str = ""
    """The launch's epoch (``TFT_JOB_EPOCH``); empty when started without tftrun."""

    @property
    def is_scheduler(self) -> bool:
        return self.role == ROLE_SCHEDULER

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerEnv:
        env = os.environ if env is None else env
        rank = _int(env, RANK, _int(env, MS_NODE_ID, 0) if env.get(MS_NODE_ID, "").isdigit() else 0)
        world_size = _int(env, WORLD_SIZE, _int(env, MS_WORKER_NUM, 1))
        master_addr = env.get(MASTER_ADDR) or env.get(MS_SCHED_HOST) or "127.0.0.1"
        master_port = _int(env, MASTER_PORT, _int(env, MS_SCHED_PORT, 29500))
        return cls(
            role=env.get(MS_ROLE) or ROLE_WORKER,
            rank=rank,
            local_rank=_int(env, LOCAL_RANK, rank),
            world_size=world_size,
            node_rank=_int(env, GROUP_RANK, 0),
            node_id=env.get(MS_NODE_ID) or str(rank),
            master_addr=master_addr,
            master_port=master_port,
            sched_host=env.get(MS_SCHED_HOST) or master_addr,
            sched_port=_int(env, MS_SCHED_PORT, master_port),
            restart_count=_int(env, TORCHELASTIC_RESTART_COUNT, _int(env, TFT_RESTART_COUNT, 0)),
            max_restarts=_int(env, TORCHELASTIC_MAX_RESTARTS, 0),
            run_id=env.get(TFT_RUN_ID) or env.get(TORCHELASTIC_RUN_ID) or DEFAULT_RUN_ID,
            incarnation=_int(env, TFT_INCARNATION, 0),
            log_dir=env.get(TFT_LOG_DIR) or None,
            is_recover=_flag(env, TFT_IS_RECOVER),
            job_token=env.get(TFT_JOB_TOKEN, ""),
            insecure_no_token=_flag(env, TFT_INSECURE_NO_TOKEN),
            recovery_path=env.get(MS_RECOVERY_PATH) or DEFAULT_RECOVERY_PATH,
            enable_tft=env.get(MS_ENABLE_TFT, ""),
            lineage=env.get(TFT_LINEAGE, "").strip(),
            min_worker_num=_int(env, TFT_MIN_WORKER_NUM, world_size),
            batch_policy=env.get(TFT_BATCH_POLICY, "").strip(),
            replay_membership=env.get(TFT_REPLAY_MEMBERSHIP, "").strip(),
            epoch=env.get(TFT_JOB_EPOCH, ""),
        )
