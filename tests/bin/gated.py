"""Run a script once a file exists: ``python gated.py GATE SCRIPT [ARGS...]``.

For a test that must act on a job before its workers register (queue a fault injection
with the scheduler): each worker waits for the file ``GATE`` (60 s at most, then exits 1)
and then runs ``SCRIPT`` as ``python SCRIPT ARGS`` would, as ``__main__`` with its folder
first on ``sys.path``.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

GATE_TIMEOUT = 60.0
POLL = 0.02

gate, script, *args = sys.argv[1:]
deadline = time.monotonic() + GATE_TIMEOUT
while not Path(gate).exists():
    if time.monotonic() > deadline:
        sys.exit(f"gated.py: {gate} did not appear within {GATE_TIMEOUT:g}s")
    time.sleep(POLL)
sys.argv = [script, *args]
sys.path[0] = os.path.dirname(os.path.realpath(script))
runpy.run_path(script, run_name="__main__")
