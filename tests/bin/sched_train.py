"""A small training loop that uses ``recovery``: an all_reduce per step, progress reported.

Run with ``MS_ROLE=MS_SCHED`` it is the scheduler (msrun's style). Signals, for the tests:
SIGUSR1 makes a worker stall before its next step while its heartbeat goes on (a hang);
SIGUSR2 to any worker makes every worker finish after the same step (the flag travels
in the step's all_reduce). With ``--rejoin``, a worker whose peer died waits for the
generation the scheduler forms with the peer's replacement and goes on in it. With
``--linger-rank R``, rank R of the first launch stays up after the last step until it is
killed (at most a minute), so that it dies after every other worker finished. With
``--teardown R:CODE:DELAY`` (repeatable), rank R of the first launch waits DELAY seconds
after its last step and exits CODE at once (``os._exit``: a crash in its teardown).
With ``--wrong-token-rank R``, rank R registers with a wrong job token (refused for good).
Each rank writes ``train_end`` with its last step, as ElasticTrainer does.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import recovery
from recovery import env as names
from recovery.env import WorkerEnv
from recovery.events import EventLog

LINGER = 60.0


def all_reduce(tensor: torch.Tensor, survive: bool) -> bool:
    """All-reduce; False when a peer is gone and ``survive`` says to live on."""
    try:
        dist.all_reduce(tensor)
    except RuntimeError:
        if not survive:
            raise
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0, help="0: until told to finish")
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--rejoin", action="store_true")
    parser.add_argument("--linger-rank", type=int, default=-1)
    parser.add_argument("--teardown", action="append", default=[], metavar="R:CODE:DELAY")
    parser.add_argument("--wrong-token-rank", type=int, default=-1)
    args = parser.parse_args()
    if WorkerEnv.from_env().rank == args.wrong_token_rank:
        os.environ[names.TFT_JOB_TOKEN] = "not-this-job"
    ctx = recovery.init()
    if ctx.join_pending:  # relaunched: joins once its loop is ready, which it is
        ctx.complete_join()
    print(f"rank {ctx.rank} of {ctx.world_size} in generation {ctx.generation}", flush=True)
    stall: list[bool] = []
    finish: list[bool] = []
    signal.signal(signal.SIGUSR1, lambda *_: stall.append(True))
    signal.signal(signal.SIGUSR2, lambda *_: finish.append(True))
    step = 0
    while args.steps == 0 or step < args.steps:
        while stall:
            time.sleep(0.05)
        step += 1
        # Reported before the collective: a stalled rank stays behind the others' step.
        ctx.report_step(step)
        votes = torch.tensor([1.0, 1.0 if finish else 0.0])
        if not all_reduce(votes, args.rejoin):
            # Outside the except block: nothing holds the broken group any more.
            print(f"rank {ctx.rank}: a peer died; rejoining", flush=True)
            ctx.rejoin()
            print(f"rank {ctx.rank} of {ctx.world_size} in generation {ctx.generation}",
                  flush=True)
            continue
        assert votes[0].item() == ctx.world_size
        if votes[1].item() > 0:
            break
        time.sleep(args.step_time)
    print(f"rank {ctx.rank} finished at step {step}", flush=True)
    EventLog(WorkerEnv.from_env().log_dir).emit("train_end", rank=ctx.rank, step=step)
    dist.destroy_process_group()
    first_launch = WorkerEnv.from_env().restart_count == 0
    if ctx.rank == args.linger_rank and first_launch:
        print(f"rank {ctx.rank} lingers", flush=True)
        time.sleep(LINGER)
    for rank, code, delay in (spec.split(":") for spec in args.teardown):
        if int(rank) == ctx.rank and first_launch:
            time.sleep(float(delay))
            print(f"rank {ctx.rank} exits {code} in its teardown", flush=True)
            sys.stdout.flush()
            os._exit(int(code))


if __name__ == "__main__":
    main()
