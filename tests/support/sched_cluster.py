"""A scheduler and workers of tests/bin/sched_train.py, started by hand in msrun's style."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from recovery import env as names
from recovery.control.client import SchedulerControl
from support import BIN, REPO, wait_for

SCRIPT = BIN / "sched_train.py"
TOKEN = "f0e1d2c3b4a5968778695a4b3c2d1e0f"
"""The job token of the processes a test starts by hand."""

# Every variable of the contract (the constants whose value is their own name): a test's
# processes see only what the test sets, not what the pytest process happens to have.
CONTRACT = {v for k, v in vars(names).items() if k.isupper() and k == v}


def cluster_env(log_dir: Path, port: int, worker_num: int, cooldown: float,
                heartbeat_timeout: float, progress_timeout: float,
                cluster_time_out: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CONTRACT}
    env.update({
        names.MS_WORKER_NUM: str(worker_num),
        names.MS_SCHED_HOST: "127.0.0.1",
        names.MS_SCHED_PORT: str(port),
        names.MS_ENABLE_RECOVERY: "1",
        names.MS_RECOVERY_PATH: str(log_dir.parent / "recovery"),
        names.TFT_LOG_DIR: str(log_dir),
        names.TFT_REJOIN_COOLDOWN: str(cooldown),
        names.TFT_HEARTBEAT_TIMEOUT: str(heartbeat_timeout),
        names.TFT_PROGRESS_TIMEOUT: str(progress_timeout),
        names.TFT_CLUSTER_TIME_OUT: str(cluster_time_out),
        names.OMP_NUM_THREADS: "1",
        names.TFT_JOB_TOKEN: TOKEN,
    })
    return env


class Cluster:
    """Processes started with the env contract; :meth:`close` kills whatever is left."""

    def __init__(self, tmp_path: Path, port: int, worker_num: int, cooldown: float = 1.0,
                 heartbeat_timeout: float = 5.0, progress_timeout: float = 60.0,
                 cluster_time_out: float = 60.0) -> None:
        self.log_dir = tmp_path / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.env = cluster_env(self.log_dir, port, worker_num, cooldown, heartbeat_timeout,
                               progress_timeout, cluster_time_out)
        self.procs: list[subprocess.Popen[bytes]] = []
        self._control: SchedulerControl | None = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def start(self, name: str, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"{name}.{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-u", str(SCRIPT), *args], cwd=REPO,
                                    env=env, stdout=out, stderr=subprocess.STDOUT)
        proc.log = log  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def scheduler(self) -> subprocess.Popen[bytes]:
        return self.start("scheduler", {**self.env, names.MS_ROLE: names.ROLE_SCHEDULER})

    def worker(self, node_id: str | None, *args: str, **env: str) -> subprocess.Popen[bytes]:
        worker_env = {**self.env, names.MS_ROLE: names.ROLE_WORKER, **env}
        if node_id is not None:
            worker_env[names.MS_NODE_ID] = node_id
        return self.start(f"worker_{node_id}", worker_env, *args)

    @property
    def control(self) -> SchedulerControl:
        if self._control is None:
            self._control = SchedulerControl("127.0.0.1", self.port, TOKEN, timeout=2.0)
        return self._control

    def steps(self) -> dict[int, int | None]:
        """rank -> the step it reported last, as the scheduler says (empty when down)."""
        status = self.control.status()
        return {} if status is None else {m["rank"]: m["step"] for m in status["members"]}

    def wait_all_past(self, step: int, timeout: float) -> dict[int, int | None]:
        def past() -> dict[int, int | None]:
            steps = self.steps()
            return steps if steps and all((s or 0) > step for s in steps.values()) else {}
        return wait_for(past, timeout, f"every worker past step {step}")

    def close(self) -> None:
        if self._control is not None:
            self._control.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(10)


def log_text(proc: subprocess.Popen[bytes]) -> str:
    return Path(proc.log).read_text(errors="replace")  # type: ignore[attr-defined]


def exited(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """Wait for ``proc`` to end; its exit status."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"pid {proc.pid} still running after {timeout}s:\n"
                             + log_text(proc)[-2000:]) from None


def event_fields(events: list[dict[str, Any]], *keys: str) -> list[tuple[Any, ...]]:
    return [tuple(e.get(k) for k in keys) for e in events]
