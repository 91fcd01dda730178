"""tftrun job of bench/phase_overhead.py: the step variants of phase_steps.py inside a real job.

    phase_loop.py --out FILE [--rounds R] [--steps N]

Each rank joins with ``recovery.init()`` (so its heartbeat thread runs, and the wrapped
variant's phases go to ``ClusterContext.report_phase``, as under ``ElasticTrainer``) and
runs the variants with the gradient all-reduce (``recovery.all_reduce_gradients``) between
``backward()`` and ``optimizer.step()``. Rank 0 writes ``{variant: [seconds per step, one
per round]}`` as JSON to FILE.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from phase_steps import PhaseBench

import recovery
from recovery.train.grad_sync import all_reduce_gradients


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    ctx = recovery.init()
    try:
        def exchange(model: torch.nn.Module) -> None:
            all_reduce_gradients(model.parameters())

        times = PhaseBench(ctx.report_phase, exchange).rounds(args.rounds, args.steps)
        if ctx.rank == 0:
            args.out.write_text(json.dumps(times))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
