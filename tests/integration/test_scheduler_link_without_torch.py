"""A process that talks to the scheduler through SchedulerLink imports no torch."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from support import REPO

pytestmark = pytest.mark.timeout(60)


def test_talking_to_the_scheduler_imports_no_torch(free_port: int) -> None:
    """The supervisor and tftctl use the link and nothing else of torch."""
    server = TCPStore("127.0.0.1", free_port, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=10))
    server.add("tft/news", 5)
    probe = ("import sys\n"
             "from recovery.control.rpc import SchedulerLink\n"
             f"link = SchedulerLink('127.0.0.1', {free_port}, 'token', reply_timeout=5.0)\n"
             "assert link.wait_connected(20)\n"
             "print(link.news(), 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["5", "False"]
    del server
