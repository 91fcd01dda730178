"""Launch to first step: tftrun against torchrun on the same job, in the same run.

    python bench/launch.py [--workers 4] [--rounds 3] [--json]

Both launchers start the same script (import torch, gloo group, one all_reduce); the time
is from starting the launcher until the last rank has finished its first all_reduce.
Rounds alternate which launcher goes first, so that machine noise hits both alike.
Target (issue 16): ratio ≤ 1.0, median of 3 rounds or more.

Where the time goes, per launcher (median over rounds; each phase ends when the last
rank is through it): *to the script* (launcher start until every worker's script runs:
the launcher's own start-up and its spawns, and the interpreter's), *import torch* (the
workers' own, on cores shared with the launcher's processes), *rendezvous + all_reduce*
(the group forms: it waits for the store the launcher serves). Each round's 1-minute load
average is reported beside the figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common import SCRIPTS, add_json_flag, emit, median, ratio, ratio_line, tftrun_cmd, torchrun_cmd

PHASES = ("to the script", "import torch", "rendezvous + all_reduce", "launch to first step")


def launch_to_first_step(make_cmd: Callable[..., list[str]], workers: int) -> dict[str, float]:
    """One launch: the phases' ends (seconds after the launcher started) and the load."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        load = os.getloadavg()[0]
        started = time.time()
        subprocess.run(make_cmd(workers, Path(tmp) / "logs", str(SCRIPTS / "first_step.py"),
                                str(out)), check=True, capture_output=True, timeout=300)

        def last(name: str) -> float:
            stamps = [float(p.read_text()) for p in out.glob(f"{name}_*")]
            if len(stamps) != workers:
                raise RuntimeError(f"{len(stamps)} of {workers} ranks reached {name}")
            return max(stamps) - started

        ends = [last("started"), last("imported"), last("first_step")]
        return {"to the script": ends[0], "import torch": ends[1] - ends[0],
                "rendezvous + all_reduce": ends[2] - ends[1], "launch to first step": ends[2],
                "load": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    add_json_flag(parser)
    args = parser.parse_args()
    launchers = {"tftrun": tftrun_cmd, "torchrun": torchrun_cmd}
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in launchers}
    for round_ in range(args.rounds):
        order = list(launchers) if round_ % 2 == 0 else list(launchers)[::-1]
        for name in order:
            figures = launch_to_first_step(launchers[name], args.workers)
            rounds[name].append(figures)
            print(f"round {round_ + 1} {name:<8} " + "  ".join(
                f"{k} {v:.3f}" for k, v in figures.items()), flush=True,
                file=sys.stderr if args.json else sys.stdout)
    medians = {name: {phase: median([r[phase] for r in rs]) for phase in PHASES}
               for name, rs in rounds.items()}
    loads = [r["load"] for rs in rounds.values() for r in rs]
    total = "launch to first step"
    result = {"bench": "launch", "workers": args.workers, "rounds": args.rounds,
              "medians": medians, "per_round": rounds,
              "ratio": ratio(medians["tftrun"][total], medians["torchrun"][total]),
              "target": 1.0, "load_average_1min": [min(loads), max(loads)]}
    text = [f"launch to first step, {args.workers} workers, {args.rounds} rounds "
            "(seconds, median; each phase until the last rank is through it)"]
    text += [ratio_line(phase, medians["tftrun"][phase], medians["torchrun"][phase],
                        "<= 1.0" if phase == total else "-") for phase in PHASES]
    text.append(f"load average (1 min) before the rounds: {min(loads):.1f}-{max(loads):.1f}")
    emit(result, args.json, text)


if __name__ == "__main__":
    main()
