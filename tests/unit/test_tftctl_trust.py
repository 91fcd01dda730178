"""``tftctl`` talks only to a scheduler.json of the user's own whose pid is the job's
scheduler (launcher/cli/trusted.py): a file others may write, or one naming a process that is
not the scheduler, or not listening where the file says, is no job."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from launcher.cli.status import NoJobError, query
from recovery.control.files import ENDPOINT_FILE, Endpoint


def forged(log_dir: Path, port: int, pid: int | None = None) -> Path:
    Endpoint("127.0.0.1", port, pid or os.getpid(), "r1", time.time()).write(log_dir)
    return log_dir / ENDPOINT_FILE


def test_a_live_process_that_is_not_the_jobs_scheduler_is_no_job(
        tmp_path: Path, free_port: int) -> None:
    """Say a stranger wrote the file for a listener of theirs, naming some live process of
    ours: tftctl does not connect, so it signs nothing for them."""
    forged(tmp_path, free_port)
    with pytest.raises(NoJobError, match=f"pid {os.getpid()} is not the scheduler of job r1"):
        query(tmp_path, timeout=2.0)


def test_a_scheduler_json_writable_by_others_is_no_job(tmp_path: Path, free_port: int) -> None:
    forged(tmp_path, free_port).chmod(0o666)
    with pytest.raises(NoJobError, match="is writable by others"):
        query(tmp_path, timeout=2.0)


def test_a_process_of_another_user_is_no_job(tmp_path: Path, free_port: int) -> None:
    if os.getuid() == 0 or not Path("/proc/1").exists():
        pytest.skip("needs a process of another user (pid 1, run as non-root)")
    forged(tmp_path, free_port, pid=1)
    with pytest.raises(NoJobError, match="pid 1 is not yours"):
        query(tmp_path, timeout=2.0)
