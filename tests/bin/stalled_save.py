"""Run a script whose rank's first write of one checkpoint stalls:
``python stalled_save.py RANK NAME SCRIPT [ARGS...]``.

For a test that kills a rank inside a save. Rank ``RANK``'s write of the checkpoint file
``NAME`` (``recovery.ckpt.durable.write_atomic``) stops for :data:`STALL` s just after its
temporary file is made, in the rank's first process only (``TFT_INCARNATION`` 0: its
relaunch and the other ranks save at full speed), so that the test sees the temporary
file and kills the rank inside the save however loaded the machine is: the main job's
save takes milliseconds, and polling for it was seen to miss it on 2 loaded cores.
``SCRIPT`` runs as ``python SCRIPT ARGS`` would (as ``__main__``, its folder first on
``sys.path``).
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path
from typing import BinaryIO

from recovery.ckpt import durable

STALL = 60.0
"""Seconds the write waits: far longer than a test takes to kill the rank."""

rank, name, script, *args = sys.argv[1:]
stalls = os.environ.get("RANK") == rank and os.environ.get("TFT_INCARNATION", "0") == "0"
open_temp = durable._open_temp


def stalled(temp: Path, reused: bool) -> BinaryIO:
    file = open_temp(temp, reused)
    if stalls and temp.name.startswith(f".{name}."):
        time.sleep(STALL)
    return file


durable._open_temp = stalled  # type: ignore[assignment]
sys.argv = [script, *args]
sys.path[0] = os.path.dirname(os.path.realpath(script))
runpy.run_path(script, run_name="__main__")
