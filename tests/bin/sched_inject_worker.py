"""A training loop that carries out fault injections: an all_reduce per step, step and
phase reported, ``ctx.pending_injection`` asked before each step.

Every rank all-reduces its step with MAX, so a relaunched rank goes on at the others'
step. A rank whose peer died rejoins the generation formed with the peer's replacement.
A ``uce`` is caught and the loop goes on (``ElasticTrainer`` would recover in place).
With ``--claim_at S`` every rank claims the last-words save at step S and prints the answer.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import recovery
from recovery.control.inject import deliver
from recovery.faults import DeviceError


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0, help="0: until stopped")
    parser.add_argument("--step_time", type=float, default=0.05)
    parser.add_argument("--claim_at", type=int, default=0)
    args = parser.parse_args()
    ctx = recovery.init()
    if ctx.join_pending:  # relaunched: joins once its loop is ready, which it is
        ctx.complete_join()
    print(f"rank {ctx.rank} of {ctx.world_size} in generation {ctx.generation}", flush=True)
    step = 0
    while args.steps == 0 or step < args.steps:
        # Asked before the step is reported: a hung rank stays behind the others' step.
        injection = ctx.pending_injection(step + 1)
        step += 1
        if injection is not None:
            print(f"rank {ctx.rank} got {injection.fault} (injection {injection.id}) "
                  f"at step {step}", flush=True)
            try:
                deliver(injection)
            except DeviceError as err:
                print(f"rank {ctx.rank} caught DeviceError at step {step}: {err}", flush=True)
        ctx.report_step(step)
        ctx.report_phase("computing")
        steps = torch.tensor([float(step)])
        try:
            dist.all_reduce(steps, op=dist.ReduceOp.MAX)
        except RuntimeError:
            steps = None
        if steps is None:
            # Outside the except block: nothing holds the broken group any more.
            print(f"rank {ctx.rank}: a peer died; rejoining", flush=True)
            ctx.rejoin()
            print(f"rank {ctx.rank} of {ctx.world_size} in generation {ctx.generation}",
                  flush=True)
            continue
        step = int(steps.item())
        ctx.report_phase("updating")
        if step == args.claim_at:
            granted = ctx.claim_last_words(step, consistent=True, reason="test")
            print(f"rank {ctx.rank} last words at step {step}: {granted}", flush=True)
        time.sleep(args.step_time)
    ctx.report_phase("done")
    print(f"rank {ctx.rank} finished at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
