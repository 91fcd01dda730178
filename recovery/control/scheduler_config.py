"""What the scheduler process reads from its environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from recovery import env as names
from recovery.control.signing import checked_strength, checked_token
from recovery.control.stragglers import StragglerSettings
from recovery.env import WorkerEnv
from recovery.timeouts import Timeouts

__all__ = ["SchedulerConfig"]


@dataclass(frozen=True)
class SchedulerConfig:
    """What the scheduler reads from its environment."""

    host: str
    port: int
    listen_fd: int | None
    worker_num: int
    token: str = field(repr=False)
    run_id: str
    log_dir: str | None
    recovery_path: str
    timeouts: Timeouts
    lineage: str = ""
    node_num: int = 0
    """The job's node count, 0 when not given (``--nnodes``)."""
    epoch: str = ""
    """The launch's epoch (``TFT_JOB_EPOCH``): with the token and run id, the job's key."""
    min_worker_num: int | None = None
    """The fewest workers a generation may have (None: ``worker_num``)."""
    stragglers: StragglerSettings = StragglerSettings()

    @property
    def supervised(self) -> bool:
        """tftrun started it (it passed the socket): tftrun decides when the job ends, never the scheduler."""
        return self.listen_fd is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SchedulerConfig:
        env = os.environ if env is None else env
        worker = WorkerEnv.from_env(env)
        fd_text = env.get(names.TFT_STORE_FD, "")
        return cls(
            host=worker.sched_host,
            port=worker.sched_port,
            listen_fd=int(fd_text) if fd_text else None,
            worker_num=worker.world_size,
            token=checked_strength(checked_token(worker.job_token, worker.insecure_no_token),
                                   allow_weak=env.get(names.TFT_INSECURE_WEAK_TOKEN) == "1"),
            run_id=worker.run_id,
            log_dir=worker.log_dir,
            recovery_path=worker.recovery_path,
            timeouts=Timeouts.from_env(env),
            lineage=worker.lineage,
            node_num=int(env.get(names.TFT_NODE_NUM) or 0),
            min_worker_num=worker.min_worker_num,
            epoch=worker.epoch,
            stragglers=StragglerSettings.from_env(env),
        )
