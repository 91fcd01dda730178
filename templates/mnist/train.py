"""The main job: an MNIST MLP (784-512-512-10, SGD) that resumes exactly from its checkpoints.

Run it under tftrun (or by hand, one process per rank, torchrun-style env)::

    tftrun --worker_num=4 --log_dir=./logs templates/mnist/train.py
    tftrun --worker_num=4 --log_dir=./logs --is_recover=1 templates/mnist/train.py

It trains on MNIST from ``DATA_PATH`` (idx files), else on a synthetic MNIST-shaped set.
Every rank checkpoints into its own directory under the recovery path and, when asked to
recover (``--is_recover=1``, ``TFT_IS_RECOVER=1``, or a relaunch by a restart-all policy),
continues from its newest valid checkpoint. Data order is a pure function of (seed, epoch,
step), RNG states are checkpointed and gradients are averaged in one fixed layout
(``recovery.all_reduce_gradients``, not DDP), so a resumed run ends bitwise equal to an
uninterrupted one. Under tftrun, the loop survives ``kill -9`` of any rank: the dead rank
is relaunched, every rank rolls back to the newest checkpoint they all hold, and training
goes on (``recovery.train.elastic.ElasticTrainer``). Output: ``step=<n> loss=<x>`` every
``--log_every`` steps, and on rank 0 at the end ``final step=<n> params_sha256=<hex>``.
``--device cuda`` trains on the worker's GPU (``LOCAL_RANK`` modulo the GPUs it sees), the
collectives still on gloo, which all-reduces and broadcasts CUDA tensors.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
from collections.abc import Sequence
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mnist_data import load_dataset

import recovery
from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver
from recovery.ckpt.digest import params_sha256
from recovery.ckpt.manifest import CheckpointError
from recovery.env import DATA_PATH, WorkerEnv
from recovery.train.elastic import ElasticTrainer
from recovery.train.sampler import ResumableDistributedSampler

logger = logging.getLogger("mnist")

# Finite, so that a rank whose peer died is never stuck for 30 minutes (gloo's default).
PROCESS_GROUP_TIMEOUT = timedelta(minutes=5)
# MNIST's mean and standard deviation, as in MindSpore's sample.
MEAN, STD = 0.1307, 0.3081
HIDDEN = 512
"""The width of the two hidden layers in MindSpore's sample."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1, help="epochs to train (default 1)")
    parser.add_argument("--max_steps", type=int, default=0, help="stop after this global step (0: no limit)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the weights and of the data order")
    parser.add_argument("--save_steps", type=int, default=100, help="checkpoint every N global steps (>= 1)")
    parser.add_argument("--is_recover", type=int, default=0, choices=[0, 1],
                        help="resume from the newest valid checkpoint")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--hidden_size", type=int, default=HIDDEN,
                        help=f"width of the two hidden layers (default {HIDDEN}, the sample's)")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (the seeds' job uses 0)")
    parser.add_argument("--ckpt_dir", default=None,
                        help="this rank's checkpoint directory (default: per rank under MS_RECOVERY_PATH)")
    parser.add_argument("--keep_max", type=int, default=5, help="checkpoints to keep per rank")
    parser.add_argument("--async_save", type=int, default=0, choices=[0, 1], help="write checkpoints in the background")
    parser.add_argument("--synthetic_size", type=int, default=60000, help="samples in the synthetic set (no DATA_PATH)")
    parser.add_argument("--log_every", type=int, default=10, help="print the loss every N steps")
    parser.add_argument("--batch_policy", default=None, choices=["constant", "shrink"],
                        help="what a step trains while ranks are missing (docs/elastic.md); "
                             "default: TFT_BATCH_POLICY, else constant")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where the model and batches live; cuda: this worker's GPU, "
                             "LOCAL_RANK modulo the GPUs it sees (the collectives stay on gloo)")
    parser.add_argument("--log_params_hash", action="store_true",
                        help="log each committed step's parameter hash and micro-batches")
    parser.add_argument(
        "--allow_world_size_change", action="store_true",
        help="resume even if the checkpoints were written with another number of workers",
    )
    args = parser.parse_args(argv)
    if args.save_steps < 1 or args.log_every < 1 or args.hidden_size < 1:
        parser.error("--save_steps, --log_every and --hidden_size must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device=cuda: this process sees no CUDA device")
    return args


def worker_device(name: str, local_rank: int) -> torch.device:
    """``cpu``, or this worker's GPU (``LOCAL_RANK`` modulo the GPUs it sees), made current."""
    if name == "cpu":
        return torch.device("cpu")
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def build_model(hidden: int = HIDDEN) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(28 * 28, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(args: argparse.Namespace, ctx: recovery.ClusterContext, device: torch.device) -> None:
    seed_everything(args.seed)
    model = build_model(args.hidden_size).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    images, labels = load_dataset(os.environ.get(DATA_PATH), args.synthetic_size)
    sampler = ResumableDistributedSampler(
        len(labels), args.batch_size, num_replicas=ctx.world_size, rank=ctx.rank, seed=args.seed
    )
    config = CheckpointConfig(
        save_checkpoint_steps=args.save_steps, keep_checkpoint_max=args.keep_max,
        append_info=["epoch_num", "step_num"], async_save=bool(args.async_save),
    )
    saver = CheckpointSaver(model, optimizer, config=config, prefix="mnist", directory=args.ckpt_dir, sampler=sampler)
    trainer = ElasticTrainer(ctx, model, optimizer, saver=saver, sampler=sampler, resume=bool(args.is_recover),
                             allow_world_size_change=args.allow_world_size_change,
                             batch_policy=args.batch_policy, log_params_hash=args.log_params_hash)
    # A plain loop: resuming, pausing when a peer dies, rolling back and going on happen
    # inside trainer.steps() and trainer.all_reduce_gradients().
    for step in trainer.steps(args.epochs, args.max_steps):
        inputs = (images[step.indices].to(device).float() / 255 - MEAN) / STD
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), labels[step.indices].to(device))
        loss.backward()
        trainer.all_reduce_gradients()
        optimizer.step()
        if step.global_step % args.log_every == 0:
            print(f"step={step.global_step} loss={loss.item():.6f}", flush=True)
    if ctx.rank == 0:
        print(f"final step={trainer.position.global_step} params_sha256={params_sha256(model)}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env = WorkerEnv.from_env()
    logging.basicConfig(level=logging.INFO, format=f"[rank {env.rank}] %(levelname)s %(name)s: %(message)s")
    try:
        ctx = recovery.init(timeout=PROCESS_GROUP_TIMEOUT)  # the scheduler's role never returns
        train(args, ctx, worker_device(args.device, env.local_rank))
    except CheckpointError as err:
        logger.error("%s", err)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
