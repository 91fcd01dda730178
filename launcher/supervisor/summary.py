"""What the supervisor shows of the job: ``job_start``, the live view's rows, the summary."""

from __future__ import annotations

import os
import time

from launcher.config import LaunchConfig
from launcher.procs.spec import error_file
from launcher.supervisor.failures import read_error_file
from launcher.supervisor.job_view import Ending
from launcher.supervisor.state import Worker, WorkerState
from launcher.view.logs import last_lines
from launcher.view.progress import run_span
from launcher.view.render import Row, SummaryRow, print_summary, run_line
from recovery.events import EVENTS_FILE

__all__ = ["job_start_fields", "live_rows", "print_job_summary", "SUMMARY_LOG_LINES"]

SUMMARY_LOG_LINES = 10


def job_start_fields(config: LaunchConfig) -> dict[str, object]:
    """The ``job_start`` event's fields: what this tftrun was asked to run."""
    return {"run_id": config.run_id, "pid": os.getpid(), "script": str(config.script),
            "script_args": list(config.script_args), "worker_num": config.worker_num,
            "local_worker_num": config.nproc, "node_rank": config.node_rank,
            "master_addr": config.master_addr, "master_port": config.master_port,
            "log_dir": str(config.log_dir), "max_restarts": config.max_restarts,
            "is_recover": config.is_recover, "lineage": config.lineage}


def live_rows(config: LaunchConfig, workers: list[Worker], restart_at: float | None,
              now: float) -> list[Row]:
    """One row per worker: its state (a wait counts down), restarts and last log line."""
    return [Row(w.rank, w.pid, _state_text(w, restart_at, now), w.restarts,
                (last_lines(config.worker_log(w.rank), 1) or [""])[0])
            for w in workers]


def _state_text(worker: Worker, restart_at: float | None, now: float) -> str:
    """The live view's state; a relaunch or a group restart counts its wait down."""
    due = worker.deadline if worker.state is WorkerState.COOLDOWN else (
        restart_at if worker.state is not WorkerState.STOPPING else None)
    if due is not None:
        return f"cooldown {max(0.0, due - now):.0f}s"
    return worker.state.value


def print_job_summary(config: LaunchConfig, workers: list[Worker], ending: Ending) -> None:
    """The table of every worker's end; the wall time, final step, steps/s and the log
    folder; the failing rank's root cause and last lines."""
    rows = [SummaryRow(w.rank, w.pid, w.last_exit.describe() if w.last_exit else w.state.value,
                       w.restarts) for w in workers]
    figures = run_line(run_span(config.log_dir / EVENTS_FILE), time.time(),
                       str(config.log_dir.resolve()))
    failing = ending.failing
    if failing is None:
        print_summary(rows, None, [], None, figures)
        return
    root_cause = read_error_file(error_file(config, failing.rank))
    print_summary(rows, f"rank {failing.rank} (pid {failing.pid}) {failing.reason}",
                  last_lines(config.worker_log(failing.rank), SUMMARY_LOG_LINES),
                  root_cause, figures)
