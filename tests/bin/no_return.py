"""A rank whose relaunches never come back: ``python no_return.py RANK SCRIPT [ARGS...]``.

Runs ``SCRIPT`` as ``python SCRIPT ARGS`` would (as ``__main__``, its folder first on
``sys.path``), except in a relaunch of rank ``RANK`` (``TFT_INCARNATION`` above 0), which
exits 1 at once, as a node whose disk or device is gone would, every time.
"""

from __future__ import annotations

import os
import runpy
import sys

rank, script, *args = sys.argv[1:]
if os.environ.get("RANK") == rank and int(os.environ.get("TFT_INCARNATION", "0")) > 0:
    sys.exit(f"no_return.py: rank {rank} cannot come back (incarnation "
             f"{os.environ['TFT_INCARNATION']})")
sys.argv = [script, *args]
sys.path[0] = os.path.dirname(os.path.realpath(script))
runpy.run_path(script, run_name="__main__")
