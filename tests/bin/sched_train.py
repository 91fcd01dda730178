"""A small training loop that uses ``recovery``: an all_reduce per step, progress reported.

Run with ``MS_ROLE=MS_SCHED`` it is the scheduler (msrun's style). SIGUSR1 makes a worker
stall before its next step while its heartbeat goes on: a hang, for the tests.
"""

from __future__ import annotations

import argparse
import signal
import time

import torch
import torch.distributed as dist

import recovery


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0, help="0: run until killed")
    parser.add_argument("--step-time", type=float, default=0.05)
    args = parser.parse_args()
    ctx = recovery.init()
    print(f"rank {ctx.rank} of {ctx.world_size} in generation {ctx.generation}", flush=True)
    stalled = []
    signal.signal(signal.SIGUSR1, lambda *_: stalled.append(True))
    tensor = torch.ones(1)
    step = 0
    while args.steps == 0 or step < args.steps:
        while stalled:
            time.sleep(0.05)
        step += 1
        # Reported before the collective: a stalled rank stays behind the others' step.
        ctx.report_step(step)
        tensor.fill_(1.0)
        dist.all_reduce(tensor)
        assert tensor.item() == ctx.world_size
        time.sleep(args.step_time)
    print(f"rank {ctx.rank} finished at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
