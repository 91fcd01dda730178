"""Per-rank recovery inside a plain training loop: pause, re-form, restore, go on.

A user writes an ordinary loop around :meth:`ElasticTrainer.steps`::

    trainer = ElasticTrainer(ctx, model, optimizer, saver=saver, sampler=sampler)
    for step in trainer.steps(epochs=2):
        optimizer.zero_grad()
        loss_fn(model(x[step.indices]), y[step.indices]).backward()
        trainer.all_reduce_gradients()
        optimizer.step()

The trainer wraps the optimizer (:func:`recovery.phase.wrap_optimizer`), so it knows
whether this rank's state is that of a completed step, and can void a step whose
gradient exchange failed: ``optimizer.step()`` then does nothing and every rank stays at
its last completed step.

* **A peer dies.** The gradient all-reduce fails (its ring neighbours see the reset at
  once; the others see the scheduler announce a new generation between polls of the
  collective). The trainer remembers it instead of raising. Before the next step each
  survivor, if it is consistent and the scheduler picks it, saves the last-words
  checkpoint of its last completed step for every rank (TTP, :mod:`recovery.last_words`);
  then it drops the broken group and joins the generation the scheduler forms once the
  dead rank is relaunched. There every member reports its state; the newest consistent
  one sends its state to the others over the new group (ARF, :mod:`recovery.replica`), or,
  without such a replica, every rank restores the newest checkpoint all ranks hold,
  last-words ones included. The relaunched rank does the same from its first step.
* **A rank's device fails** (a :class:`recovery.faults.DeviceError` in its step). The
  rank flags it in the step's gradient all-reduce (no extra round trip); every rank voids
  the step, the faulty rank discards its state and receives a healthy replica's over the
  same group, and all redo the step (UCE). No process restarts, no group is rebuilt.
* **The job is stopped** (SIGTERM). Each rank finishes its step; one consistent rank saves
  the last words, and all exit.

The states are drawn in docs/recovery.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from recovery import layout
from recovery.checkpoint import CheckpointSaver
from recovery.cluster import ClusterContext
from recovery.digest import params_sha256
from recovery.env import WorkerEnv
from recovery.events import EventLog, read_events
from recovery.faults import is_recoverable_device_error
from recovery.grad_sync import all_reduce_gradients
from recovery.inject import Injection, deliver
from recovery.last_words import save_last_words
from recovery.manifest import Candidate, CheckpointKind, candidates, problem
from recovery.modes import TftModes, parse_enable_tft
from recovery.phase import phase_of
from recovery.replica import ReplicaReport, broadcast_state, choose_source, gather_reports
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


def checkpoint_dirs(saver: CheckpointSaver, recovery_path: str, rank: int) -> list[Path]:
    """Where this rank's checkpoints are: its periodic directory, then every last-words one."""
    return [saver.directory, *layout.ttp_rank_dirs(recovery_path, rank)]


def _valid(directories: list[Path], lineage: str) -> list[Candidate]:
    return [c for d in directories for c in candidates(d, lineage) if problem(c) is None]


def agree_rollback_point(directories: list[Path], lineage: str) -> tuple[int, int] | None:
    """The newest (epoch, step) for which *every* rank of the group has a valid checkpoint.

    Each rank lists its own valid checkpoints (periodic and last-words) of the job's
    ``lineage``; the lists are gathered over the current process group, so every rank
    computes the same answer. ``None`` when there is none.
    """
    mine = sorted({(c.epoch, c.step) for c in _valid(directories, lineage)})
    everyone: list[list[tuple[int, int]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    common = set.intersection(*(set(map(tuple, points or [])) for points in everyone))
    return max(common) if common else None  # type: ignore[return-value]


def _candidate_at(directories: list[Path], point: tuple[int, int], lineage: str) -> Candidate:
    """A valid checkpoint at ``point``: a periodic one if there is, else a last-words one."""
    for candidate in _valid(directories, lineage):
        if (candidate.epoch, candidate.step) == point:
            return candidate
    raise FileNotFoundError(f"no valid checkpoint for epoch {point[0]} step {point[1]} in {directories}")


class ElasticTrainer:
    """Runs the steps of a data-parallel job so that a fault costs little or nothing.

    Args:
        ctx: what :func:`recovery.init` returned.
        model: the model (its parameters' gradients are averaged in one fixed layout).
        optimizer: its optimizer (wrapped to report its phase).
        saver: the checkpoint saver of this rank (it decides when to save).
        sampler: the resumable sampler that orders this rank's data.
        lr_scheduler: the LR scheduler, if any (restored with the rest).
        resume: start from the newest state every rank can reach, as after a failure
            (also when ``TFT_IS_RECOVER=1``, a relaunch into a later generation, or a
            restart of the whole group).
        allow_world_size_change: resume from checkpoints of another world size.
        modes: the lose-nothing modes; by default from ``MS_ENABLE_TFT``
            (:mod:`recovery.modes`).
    """

    def __init__(self, ctx: ClusterContext, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, *, saver: CheckpointSaver,
                 sampler: ResumableDistributedSampler, lr_scheduler: Any = None,
                 resume: bool = False, allow_world_size_change: bool = False,
                 modes: TftModes | None = None) -> None:
        self.ctx = ctx
        self.model = model
        self.optimizer = optimizer
        self.saver = saver
        self.sampler = sampler
        self.lr_scheduler = lr_scheduler
        self.position = ResumePoint()
        self.rollbacks = 0
        worker_env = WorkerEnv.from_env()
        self.modes = modes or parse_enable_tft(worker_env.enable_tft)
        self.phase = phase_of(optimizer)
        self.phase.listener = ctx.report_phase
        self._recovery_path = worker_env.recovery_path
        self._events = EventLog(worker_env.log_dir)
        self._resume = resume or worker_env.is_recover or worker_env.restart_count > 0
        self._allow_world_size_change = allow_world_size_change
        self._fault: str | None = None
        self._fault_at = 0.0
        self._device_fault: BaseException | None = None
        self._injected_uce: Injection | None = None
        self._faulty_ranks: frozenset[int] = frozenset()
        self._stop_signal: int | None = None

    # ------------------------------------------------------------------ the loop
    def steps(self, epochs: int, max_steps: int = 0) -> Iterator[Step]:
        """Yield every step still to run, recovering from faults in between.

        Args:
            epochs: train epochs 1..``epochs``.
            max_steps: stop after this global step (0: no limit).
        """
        with self._stop_signals_noted():
            if self.ctx.generation > 0 or self._resume:
                # A relaunched rank, or a resumed job: take the state the others can give.
                self._resync(newcomer=True)
            if self.position.global_step == 0:
                # A checkpoint of the initial state, so that a fault before the first
                # periodic save still has a common point to roll back to.
                self.saver.save(self.position.epoch, 0, 0)
            while True:
                for step in self._schedule(epochs, max_steps):
                    self._take_injection(step.global_step)
                    self.phase.start_step(step.global_step)
                    if self.ctx.latest_generation != self.ctx.generation:
                        self._note_fault("the scheduler formed a new generation")
                    else:
                        yield step
                    if self._faulty_ranks:
                        self._repair_in_place()
                        break
                    if self._fault is not None:
                        self._recover()
                        break
                    self._complete(step)
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

    def _complete(self, step: Step) -> None:
        """The step is done on this rank: record it, checkpoint, stop if asked to."""
        self.position = ResumePoint(step.epoch, step.step, step.global_step)
        self.ctx.report_step(step.global_step)
        self.saver.step_end(step.epoch, step.step, step.global_step)
        if self._stop_signal is not None:
            self._stop("the job is being stopped")

    # ------------------------------------------------------------------ collectives
    def all_reduce_gradients(self) -> None:
        """Average the gradients over the group in one fixed flat layout.

        On a peer failure this returns without raising: the step is void (the optimizer
        update that follows does nothing), and the loop recovers before the next step. A
        recoverable device error of this rank (or an injected ``uce``) is flagged to every
        rank in the same all-reduce; the step is then void everywhere and the loop repairs
        the faulty ranks in place.
        """
        if self._fault is not None:
            return
        # Reaching the step's collective is progress: a rank stuck before it (hung) stays
        # behind the others in the scheduler's eyes, so its progress verdict names it.
        self.ctx.report_step(self.phase.step)
        self._raise_injected_uce()
        damaged = self._device_fault or self.phase.device_error
        if damaged is not None and not self.modes.uce:
            raise damaged  # in-place recovery is off: the rank dies and is relaunched
        flags = torch.zeros(self.ctx.world_size)
        flags[self.ctx.rank] = 1.0 if damaged else 0.0
        try:
            all_reduce_gradients(self.model.parameters(),
                                 wait=lambda work: wait_collective(work, self.ctx),
                                 flags=flags)
        except PeerFailure as failure:
            self._note_fault(str(failure))
        else:
            self._faulty_ranks = frozenset(int(r) for r in torch.nonzero(flags).flatten())
            if damaged is not None and dist.get_world_size() == 1:
                self._faulty_ranks = frozenset({self.ctx.rank})
        if self._fault is not None or self._faulty_ranks:
            self.phase.void = True

    def _note_fault(self, cause: str) -> None:
        if self._fault is None:
            self._fault, self._fault_at = cause, time.time()
            self.phase.void = True
            logger.warning("[rank %d] peer failure in generation %d: %s", self.ctx.rank,
                           self.ctx.generation, cause)

    # ------------------------------------------------------------------ injected faults
    def _take_injection(self, global_step: int) -> None:
        """Carry out a fault injected for this step (``tftctl inject``)."""
        injection = self.ctx.pending_injection(global_step)
        if injection is None:
            return
        logger.warning("[rank %d] injected fault %s at step %d", self.ctx.rank, injection.fault,
                       global_step)
        if injection.fault == "uce":
            self._injected_uce = injection  # raised inside the step, at its collective
        else:
            deliver(injection)

    def _raise_injected_uce(self) -> None:
        injection, self._injected_uce = self._injected_uce, None
        if injection is None:
            return
        try:
            deliver(injection)
        except Exception as err:  # noqa: BLE001 - only a recoverable one is kept
            if not is_recoverable_device_error(err):
                raise
            self._device_fault = err
        self._events.emit("fault", rank=self.ctx.rank, pid=os.getpid(),
                          incarnation=self.ctx.incarnation, cause="uce",
                          step=self.phase.step, error=str(self._device_fault))
        self._fault_at = time.time()

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        """After a peer's death: last words, join the next generation, resynchronise."""
        if self.modes.ttp:
            self._save_last_words(self._fault or "a peer failed")
        if self._stop_signal is not None:
            self._stop("the job is being stopped")
        self.ctx.rejoin()
        self._resync(newcomer=False)
        self._fault = None
        self.rollbacks += 1

    def _save_last_words(self, why: str) -> None:
        """If this rank is consistent and the scheduler picks it, save every rank's last words."""
        consistent = self.phase.consistent
        reason = "" if consistent else "mid-update: its state is half-updated"
        step = self.position.global_step
        if not self.ctx.claim_last_words(step, consistent, reason):
            if not consistent:
                self._events.emit("last_words_skipped", rank=self.ctx.rank, step=step,
                                  reason=reason)
            return
        if step == 0:
            return  # the initial checkpoint holds step 0 already
        self.saver.wait()
        started = time.monotonic()
        path = save_last_words(self.saver, self._recovery_path, self.position, self.ctx.world_size)
        self._events.emit("last_words_saved", rank=self.ctx.rank, step=step,
                          epoch=self.position.epoch, step_in_epoch=self.position.step,
                          path=str(path), ranks=self.ctx.world_size, why=why,
                          seconds=round(time.monotonic() - started, 3))

    def _stop(self, why: str) -> None:
        """End this process on a stop signal, after the last words if it may save them."""
        if self.modes.ttp:
            self._save_last_words(why)
        signum = self._stop_signal or signal.SIGTERM
        logger.warning("[rank %d] stopping at step %d: %s", self.ctx.rank,
                       self.position.global_step, why)
        raise SystemExit(128 + signum)

    def _resync(self, newcomer: bool) -> None:
        """In a freshly joined group: take the newest consistent replica's state, or roll back."""
        self.saver.wait()
        consistent = not newcomer and self.phase.consistent
        reports = gather_reports(ReplicaReport(self.ctx.rank, consistent, self.position.global_step))
        source = choose_source(reports) if self.modes.arf else None
        if source is not None:
            self._copy_from_replica(source, reports, "replica")
            return
        if self.modes.arf and self.ctx.generation > 0:
            self._emit_as_leader("fallback", mode="replica", to="checkpoint",
                                 reason="no member holds a consistent state")
        self._roll_back()

    def _copy_from_replica(self, source: ReplicaReport, reports: list[ReplicaReport],
                           label: str, damaged: frozenset[int] = frozenset()) -> None:
        """Broadcast ``source``'s state; the ranks behind it (or damaged) load it."""
        mine = reports[self.ctx.rank]
        receive = (self.ctx.rank in damaged or not mine.consistent
                   or mine.global_step != source.global_step)
        state = self.saver.state(self.position) if self.ctx.rank == source.rank else None
        if receive and self.ctx.rank in damaged:
            self._discard_state()
        state = broadcast_state(state, source.rank)
        if receive:
            self.position = restore_checkpoint(
                state, self.model, self.optimizer, self.lr_scheduler, sampler=self.sampler,
                allow_world_size_change=self._allow_world_size_change)
        self._after_restore(label, from_rank=source.rank)

    def _discard_state(self) -> None:
        """Drop the damaged rank's parameters and optimizer state, re-allocating the storage."""
        with torch.no_grad():
            for param in self.model.parameters():
                param.data = torch.empty_like(param.data)
        self.optimizer.state.clear()

    def _repair_in_place(self) -> None:
        """Every rank voided this step; repair the faulty ranks from a healthy one, redo it."""
        damaged, self._faulty_ranks = self._faulty_ranks, frozenset()
        reports = gather_reports(ReplicaReport(self.ctx.rank, self.phase.consistent
                                               and self.ctx.rank not in damaged,
                                               self.position.global_step))
        source = choose_source(reports, excluded=damaged)
        if source is not None:
            self._copy_from_replica(source, reports, "in_place", damaged)
        else:
            self._emit_as_leader("fallback", mode="in_place", to="checkpoint",
                                 reason="no healthy replica: every rank's device failed")
            self._roll_back()
        self._device_fault = None
        self.phase.device_error = None
        self.rollbacks += 1

    def _roll_back(self) -> None:
        """Restore the newest checkpoint every rank holds (or the start, if none)."""
        directories = checkpoint_dirs(self.saver, self._recovery_path, self.ctx.rank)
        point = agree_rollback_point(directories, self.saver.lineage)
        if point is None:
            if self.ctx.generation == 0:
                logger.info("no checkpoint common to every rank: starting from the beginning")
                return
            raise RuntimeError("the ranks hold no checkpoint in common: cannot roll back")
        candidate = _candidate_at(directories, point, self.saver.lineage)
        self.position = restore_checkpoint(
            load_checkpoint(candidate.path), self.model, self.optimizer, self.lr_scheduler,
            sampler=self.sampler, path=candidate.path,
            allow_world_size_change=self._allow_world_size_change)
        logger.info("resumed from %s (epoch %d, step %d, global step %d)", candidate.path,
                    self.position.epoch, self.position.step, self.position.global_step)
        last_words = candidate.kind is CheckpointKind.LAST_WORDS
        self._after_restore("last_words" if last_words else "checkpoint", epoch=point[0],
                            step_in_epoch=point[1])

    def _after_restore(self, source: str, **fields: Any) -> None:
        """Record where training goes on, and (rank 0) the ``rollback``/``recovered`` events."""
        self._emit_as_leader("rollback", step=self.position.global_step, source=source,
                             generation=self.ctx.generation, **fields)
        self._emit_as_leader("recovered", generation=self.ctx.generation,
                             step=self.position.global_step, source=source,
                             seconds=round(time.time() - self._last_fault_time(), 3))

    def _emit_as_leader(self, event: str, **fields: Any) -> None:
        """Emit an event the ranks agree on once, from rank 0."""
        if self.ctx.rank == 0:
            self._events.emit(event, **fields)

    def _last_fault_time(self) -> float:
        """When the fault happened: the newest ``fault`` event, else when this rank saw it."""
        faults = ([e["ts"] for e in read_events(self._events.path) if e["event"] == "fault"]
                  if self._events.path else [])
        return max(faults, default=self._fault_at or time.time())

    # ------------------------------------------------------------------ stop signals
    @contextlib.contextmanager
    def _stop_signals_noted(self) -> Iterator[None]:
        """While training, SIGTERM ends the current step first (then last words, exit)."""
        if not self.modes.ttp or threading.current_thread() is not threading.main_thread():
            yield
            return

        def note(signum: int, _frame: Any) -> None:
            self._stop_signal = signum

        previous = signal.signal(signal.SIGTERM, note)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)
