"""Per-rank recovery inside a plain training loop: pause, re-form, roll back, go on.

A user writes an ordinary loop around :meth:`ElasticTrainer.steps`::

    trainer = ElasticTrainer(ctx, model, optimizer, saver=saver, sampler=sampler)
    for step in trainer.steps(epochs=2):
        optimizer.zero_grad()
        loss_fn(model(x[step.indices]), y[step.indices]).backward()
        trainer.all_reduce_gradients()
        optimizer.step()

When a peer dies, the gradient all-reduce fails (its ring neighbours see the reset at
once; the others see the scheduler announce a new generation between polls of the
collective) and the trainer remembers it instead of raising; the step's result is thrown
away. Before the next step, every survivor drops the broken process group, waits for the
generation the scheduler forms once the dead rank has been relaunched, joins it, agrees
with the others on the newest checkpoint that *every* rank holds, restores it (model,
optimizer, RNGs, data position) and continues from there. The relaunched rank does the
same from its first step. The states are drawn in docs/recovery.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from recovery.checkpoint import CheckpointSaver
from recovery.digest import params_sha256
from recovery.cluster import ClusterContext
from recovery.env import WorkerEnv
from recovery.events import EventLog, read_events
from recovery.grad_sync import all_reduce_gradients
from recovery.manifest import Candidate, candidates, problem
from recovery.restore import ResumePoint, load_checkpoint, restore_checkpoint
from recovery.sampler import ResumableDistributedSampler

__all__ = ["ElasticTrainer", "Step", "PeerFailure", "agree_rollback_point"]

logger = logging.getLogger(__name__)

POLL = timedelta(milliseconds=100)
"""How long one wait on a collective lasts before the generation is checked again."""


class PeerFailure(RuntimeError):
    """A collective of the current generation cannot complete: a member is gone."""


@dataclass(frozen=True)
class Step:
    """One training step to run: ``global_step`` counts from 1 over the whole run."""

    epoch: int
    step: int
    global_step: int
    indices: torch.Tensor


def _is_timeout(err: RuntimeError) -> bool:
    return "timed out" in str(err).lower()


def wait_collective(work: Any, ctx: ClusterContext) -> None:
    """Wait for an async collective, polling, so that a new generation interrupts it.

    A timed-out ``wait`` does not cancel the operation; waiting again completes it if the
    peers arrive. Any other error means a peer's connection broke.

    Raises:
        PeerFailure: a peer is gone, or the scheduler formed a newer generation.
    """
    while True:
        try:
            work.wait(timeout=POLL)
            return
        except RuntimeError as err:
            if _is_timeout(err) and ctx.latest_generation == ctx.generation:
                continue
            cause = "a newer generation was formed" if _is_timeout(err) else str(err).splitlines()[0]
        # Outside the except block: the exception and its traceback (which hold the
        # broken group's buffers) are released before anyone re-forms.
        raise PeerFailure(cause)


def _valid_points(directory: Any) -> list[tuple[int, int]]:
    """(epoch, step) of every checkpoint of ``directory`` that passes the manifest checks."""
    return sorted({(c.epoch, c.step) for c in candidates(directory) if problem(c) is None})


def agree_rollback_point(directory: Any) -> tuple[int, int] | None:
    """The newest (epoch, step) for which *every* rank of the group has a valid checkpoint.

    Each rank lists its own valid checkpoints; the lists are gathered over the current
    process group, so every rank computes the same answer. ``None`` when there is none.
    """
    mine = _valid_points(directory)
    everyone: list[list[tuple[int, int]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    common = set.intersection(*(set(map(tuple, points or [])) for points in everyone))
    return max(common) if common else None  # type: ignore[return-value]


def _candidate_at(directory: Any, point: tuple[int, int]) -> Candidate:
    for candidate in candidates(directory):
        if (candidate.epoch, candidate.step) == point and problem(candidate) is None:
            return candidate
    raise FileNotFoundError(f"no valid checkpoint for epoch {point[0]} step {point[1]} in {directory}")


class ElasticTrainer:
    """Runs the steps of a data-parallel job so that a dead peer costs a rollback, not the job.

    Args:
        ctx: what :func:`recovery.init` returned.
        model: the model (its parameters' gradients are averaged in one fixed layout).
        optimizer: its optimizer.
        saver: the checkpoint saver of this rank (it decides when to save).
        sampler: the resumable sampler that orders this rank's data.
        lr_scheduler: the LR scheduler, if any (restored with the rest).
        resume: start from the newest checkpoint every rank holds, as after a failure
            (also when ``TFT_IS_RECOVER=1``, a relaunch into a later generation, or a
            restart of the whole group).
        allow_world_size_change: resume from checkpoints of another world size.
    """

    def __init__(self, ctx: ClusterContext, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, *, saver: CheckpointSaver,
                 sampler: ResumableDistributedSampler, lr_scheduler: Any = None,
                 resume: bool = False, allow_world_size_change: bool = False) -> None:
        self.ctx = ctx
        self.model = model
        self.optimizer = optimizer
        self.saver = saver
        self.sampler = sampler
        self.lr_scheduler = lr_scheduler
        self.position = ResumePoint()
        self.rollbacks = 0
        self._fault: str | None = None
        self._fault_at = 0.0
        worker_env = WorkerEnv.from_env()
        self._events = EventLog(worker_env.log_dir)
        self._resume = resume or worker_env.is_recover or worker_env.restart_count > 0
        self._allow_world_size_change = allow_world_size_change

    # ------------------------------------------------------------------ the loop
    def steps(self, epochs: int, max_steps: int = 0) -> Iterator[Step]:
        """Yield every step still to run, recovering from peer failures in between.

        Args:
            epochs: train epochs 1..``epochs``.
            max_steps: stop after this global step (0: no limit).
        """
        if self.ctx.generation > 0 or self._resume:
            # A relaunched rank, or a resumed job: start where every rank can.
            self._roll_back(source="checkpoint")
        if self.position.global_step == 0:
            # A checkpoint of the initial state, so that a fault before the first periodic
            # save still has a common point to roll back to.
            self.saver.save(self.position.epoch, 0, 0)
        while True:
            for step in self._schedule(epochs, max_steps):
                if self.ctx.latest_generation != self.ctx.generation:
                    self._note_fault("the scheduler formed a new generation")
                else:
                    yield step
                if self._fault is not None:
                    self._recover()
                    break
                self.position = ResumePoint(step.epoch, step.step, step.global_step)
                self.ctx.report_step(step.global_step)
                self.saver.step_end(step.epoch, step.step, step.global_step)
            else:
                break
        self.saver.train_end(self.position.epoch, self.position.step, self.position.global_step)
        self._events.emit("train_end", rank=self.ctx.rank, step=self.position.global_step,
                          params_sha256=params_sha256(self.model))

    def _schedule(self, epochs: int, max_steps: int) -> Iterator[Step]:
        start = self.position
        global_step = start.global_step
        for epoch in range(start.epoch, epochs + 1):
            self.sampler.set_epoch(epoch)
            if epoch == start.epoch:
                self.sampler.set_init_step(start.step)
            for step, indices in self.sampler.batches():
                if max_steps and global_step >= max_steps:
                    return
                global_step += 1
                yield Step(epoch, step, global_step, indices)

    # ------------------------------------------------------------------ collectives
    def all_reduce_gradients(self) -> None:
        """Average the gradients over the group in one fixed flat layout.

        On a peer failure this returns without raising: the step is void, and the loop
        recovers before the next one (the optimizer update that follows is undone by the
        rollback).
        """
        if self._fault is not None:
            return
        try:
            all_reduce_gradients(self.model.parameters(),
                                 wait=lambda work: wait_collective(work, self.ctx))
        except PeerFailure as failure:
            self._note_fault(str(failure))

    def _note_fault(self, cause: str) -> None:
        if self._fault is None:
            self._fault, self._fault_at = cause, time.time()
            logger.warning("[rank %d] peer failure in generation %d: %s", self.ctx.rank,
                           self.ctx.generation, cause)

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        """Join the next generation, roll back to the common checkpoint, clear the fault."""
        self.ctx.rejoin()
        self._roll_back(source="checkpoint")
        self._fault = None
        self.rollbacks += 1

    def _roll_back(self, source: str) -> None:
        """Restore the newest checkpoint every rank holds (or the start, if none)."""
        self.saver.wait()
        point = agree_rollback_point(self.saver.directory)
        if point is None:
            if self.ctx.generation == 0:
                logger.info("no checkpoint common to every rank: starting from the beginning")
                return
            raise RuntimeError("the ranks hold no checkpoint in common: cannot roll back")
        candidate = _candidate_at(self.saver.directory, point)
        self.position = restore_checkpoint(
            load_checkpoint(candidate.path), self.model, self.optimizer, self.lr_scheduler,
            sampler=self.sampler, path=candidate.path,
            allow_world_size_change=self._allow_world_size_change)
        logger.info("resumed from %s (epoch %d, step %d, global step %d)", candidate.path,
                    self.position.epoch, self.position.step, self.position.global_step)
        if self.ctx.rank == 0:
            self._events.emit("rollback", step=self.position.global_step, epoch=point[0],
                              step_in_epoch=point[1], source=source,
                              generation=self.ctx.generation)
            self._events.emit("recovered", generation=self.ctx.generation,
                              step=self.position.global_step,
                              seconds=round(time.time() - self._last_fault_time(), 3))

    def _last_fault_time(self) -> float:
        """When the fault happened: the newest ``fault`` event, else when this rank saw it."""
        faults = ([e["ts"] for e in read_events(self._events.path) if e["event"] == "fault"]
                  if self._events.path else [])
        return max(faults, default=self._fault_at or time.time())
