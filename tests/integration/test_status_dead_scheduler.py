"""``tftctl status`` with no endpoint, or one whose scheduler process is dead: no job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli.status import NoJobError, query
from recovery.control.files import Endpoint


def test_no_endpoint_or_a_dead_scheduler_means_no_job(tmp_path: Path) -> None:
    with pytest.raises(NoJobError, match="no job is running in"):
        query(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    Endpoint("127.0.0.1", 1, dead.pid, "r1", 0.0).write(tmp_path)
    with pytest.raises(NoJobError, match="no job is running in"):
        query(tmp_path)
