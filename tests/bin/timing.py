"""The framework test jobs' step and loss timings, read by bench/frameworks_recovery.py."""

from __future__ import annotations

import os
import sys


def record(line: str, name: str = "steps") -> None:
    """Append ``line`` to ``--timing``'s ``<name>_<rank>.txt`` (bench/frameworks_recovery.py)."""
    timing = next((a.split("=", 1)[1] for a in sys.argv[3:] if a.startswith("--timing=")), None)
    if timing is not None:
        os.makedirs(timing, exist_ok=True)
        with open(os.path.join(timing, f"{name}_{os.environ['RANK']}.txt"), "a") as file:
            file.write(line + "\n")
