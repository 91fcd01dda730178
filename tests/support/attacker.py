"""tests/bin/attacker.py beside a job: a process on the job's port that holds no token."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from support import BIN, spawn, terminate

NO_TOKEN = {k: v for k, v in os.environ.items() if k != "TFT_JOB_TOKEN"}


@contextmanager
def attacker(mode: str, host: str, port: int, seconds: float, *more: str
             ) -> Iterator[subprocess.Popen[str]]:
    """tests/bin/attacker.py on the job's port, without the token; stopped on the way out."""
    proc = spawn([sys.executable, str(BIN / "attacker.py"), mode, host, str(port),
                  str(seconds), *more], env=NO_TOKEN)
    try:
        yield proc
    finally:
        terminate(proc, timeout=5)
