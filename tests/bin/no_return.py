"""Ranks whose relaunches never come back: ``python no_return.py RANKS SCRIPT [ARGS...]``.

Runs ``SCRIPT`` as ``python SCRIPT ARGS`` would (as ``__main__``, its folder first on
``sys.path``), except in a relaunch (``TFT_INCARNATION`` above 0) of one of ``RANKS``
(comma-separated), which exits 1 at once, as a node whose disk or device is gone would,
every time.
"""

from __future__ import annotations

import os
import runpy
import sys

ranks, script, *args = sys.argv[1:]
rank = os.environ.get("RANK", "")
if rank in ranks.split(",") and int(os.environ.get("TFT_INCARNATION", "0")) > 0:
    sys.exit(f"no_return.py: rank {rank} cannot come back (incarnation "
             f"{os.environ['TFT_INCARNATION']})")
sys.argv = [script, *args]
sys.path[0] = os.path.dirname(os.path.realpath(script))
runpy.run_path(script, run_name="__main__")
