"""Run a DDP script with each optimizer update it applies clocked, for
bench/frameworks_recovery.py's ``ddp`` client: the script itself stays as it is.

Usage: ``ddp_clock.py TIMING_DIR SCRIPT [ARGS...]``. Each rank appends ``count time pid`` to
``TIMING_DIR/steps_<rank>.txt`` after every update that ran (a step that recovery voided
runs none), ``count`` numbering them in this process from 1, and writes the script's output
to ``TIMING_DIR/out_<rank>.txt``.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook


def main() -> None:
    timing, script = sys.argv[1], sys.argv[2]
    os.makedirs(timing, exist_ok=True)
    rank = os.environ["RANK"]
    steps = open(os.path.join(timing, f"steps_{rank}.txt"), "a", buffering=1)  # noqa: SIM115
    sys.stdout = open(os.path.join(timing, f"out_{rank}.txt"), "a", buffering=1)  # noqa: SIM115
    count = 0

    def clock(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        nonlocal count
        count += 1
        steps.write(f"{count} {time.time()} {os.getpid()}\n")

    register_optimizer_step_post_hook(clock)
    sys.argv = sys.argv[2:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
