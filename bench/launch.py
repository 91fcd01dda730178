"""Launch to first step: tftrun against torchrun on the same job, in the same run.

    python bench/launch.py [--workers 4] [--rounds 3]

Both launchers start the same script (gloo group + one all_reduce); the time is from
starting the launcher until the last rank has finished its first all_reduce. Rounds
alternate between the launchers so that machine noise hits both alike. Target
(DESIGN.md §7): ratio ≤ 1.0.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common import SCRIPTS, median, ratio_line, torchrun_cmd, tftrun_cmd


def launch_to_first_step(make_cmd: Callable[..., list[str]], workers: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        started = time.time()
        subprocess.run(make_cmd(workers, Path(tmp) / "logs", str(SCRIPTS / "first_step.py"),
                                str(out)), check=True, capture_output=True, timeout=300)
        stamps = [float(p.read_text()) for p in out.glob("first_step_*")]
        if len(stamps) != workers:
            raise RuntimeError(f"{len(stamps)} of {workers} ranks reached their first step")
        return max(stamps) - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tft, torch_times = [], []
    for _ in range(args.rounds):
        tft.append(launch_to_first_step(tftrun_cmd, args.workers))
        torch_times.append(launch_to_first_step(torchrun_cmd, args.workers))
    print(f"launch to first step, {args.workers} workers, {args.rounds} rounds (seconds, median)")
    print(ratio_line("launch to first step", median(tft), median(torch_times), "<= 1.0"))


if __name__ == "__main__":
    main()
