"""Per-rank recovery inside a plain training loop: pause, re-form, restore, go on (docs/recovery.md).
The trainer wraps the optimizer so that it can void a step whose gradient exchange failed, keeping every
rank at its last completed step."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from recovery.ckpt.checkpoint import CheckpointSaver
from recovery.ckpt.digest import params_sha256
from recovery.ckpt.last_words import save_last_words
from recovery.ckpt.manifest import CheckpointKind
from recovery.ckpt.restore import ResumePoint, restore_checkpoint
from recovery.env import WorkerEnv
from recovery.events import EventLog
from recovery.position import TrainPosition
from recovery.runtime.abort import Aborted
from recovery.runtime.cluster import ClusterContext
from recovery.train.collective_wait import PeerFailure, wait_collective
from recovery.train.collectives import broadcast_plain
from recovery.train.compute_clock import ComputeClock
from recovery.train.ddp_exchange import GradientExchange
from recovery.train.grad_sync import all_reduce_gradients
from recovery.train.injected import InjectedFaults
from recovery.train.modes import TftModes, parse_enable_tft
from recovery.train.phase import phase_of
from recovery.train.replay import BeforeStep, MembershipReplay
from recovery.train.replica import ReplicaReport, choose_source, gather_reports, state_limit
from recovery.train.rollback import checkpoint_dirs, choose_rollback
from recovery.train.sampler import ResumableDistributedSampler
from recovery.train.shares import BatchPolicy, plan_step, steps_left
from recovery.train.state import TrainerMachine, TrainerState
from recovery.train.step_events import PAUSED, RESTORED, StepEvents
from recovery.train.stop_signals import StopSignals

__all__ = ["ElasticTrainer", "Step", "TrainerState"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step(TrainPosition):
    """One training step to run, and the position once it is done; ``indices`` are this rank's samples of it.
    In a degraded generation (docs/elastic.md) they hold all this rank's micro-batches: take the mean loss
    over them, or accumulate over ``indices.split(micro_batch_size)``, each loss divided by
    ``micro_batches``. ``cursor`` is the epoch's cursor once the step commits."""

    indices: torch.Tensor = field(kw_only=True)
    share: tuple[int, ...] = field(default=(), kw_only=True)
    """The epoch's micro-batches this rank computes (recovery/train/shares.py)."""
    micro_batch_size: int = field(default=0, kw_only=True)
    divisor: int = field(default=0, kw_only=True)
    """What the share-weighted gradient sum is divided by (0: the group's size)."""
    cursor: int = field(default=0, kw_only=True)

    @property
    def micro_batches(self) -> int:
        """How many micro-batches ``indices`` hold."""
        return len(self.share)


class ElasticTrainer:
    """Runs the steps of a data-parallel job so that a fault costs little or nothing.

    Args:
        ctx: what :func:`recovery.init` returned.
        model: a plain module, whose gradients :meth:`all_reduce_gradients` averages, or the user's
            ``DistributedDataParallel``, reduced during ``backward()``; checkpoints hold its ``module``.
        optimizer: wrapped to report its phase.
        saver: this rank's checkpoint saver (it decides when to save).
        sampler: the resumable sampler that orders this rank's data.
        resume: start from the newest state every rank can reach (also when ``TFT_IS_RECOVER=1``, in a
            relaunched rank, or after a restart of all).
        allow_world_size_change: resume from checkpoints of another world size.
        modes: the lose-nothing modes; by default from ``MS_ENABLE_TFT``.
        batch_policy: ``constant`` or ``shrink``; by default from ``TFT_BATCH_POLICY``, else ``constant``.
        log_params_hash: log every committed step's parameter hash (for tests: it hashes the model).
        replay_membership: an earlier run's ``events.jsonl`` (or log dir) whose membership changes this run
            makes again at the same steps; by default from ``TFT_REPLAY_MEMBERSHIP``.
    """

    def __init__(self, ctx: ClusterContext, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, *, saver: CheckpointSaver,
                 sampler: ResumableDistributedSampler, lr_scheduler: Any = None,
                 resume: bool = False, allow_world_size_change: bool = False,
                 modes: TftModes | None = None, batch_policy: BatchPolicy | str | None = None,
                 log_params_hash: bool = False,
                 replay_membership: str | os.PathLike[str] | None = None) -> None:
        self.ctx = ctx
        self._clock = ComputeClock()  # each step's compute time, for the straggler detector
        self.exchange = (GradientExchange(model, self._wait, self._reached_collective, self._clock)
                         if isinstance(model, DistributedDataParallel) else None)
        self.model = model.module if self.exchange is not None else model
        self.optimizer = optimizer
        self.saver = saver
        self.sampler = sampler
        self.lr_scheduler = lr_scheduler
        self.position: TrainPosition = ResumePoint()
        worker_env = WorkerEnv.from_env()
        self.modes = modes or parse_enable_tft(worker_env.enable_tft)
        self.batch_policy = BatchPolicy(batch_policy or worker_env.batch_policy
                                        or BatchPolicy.CONSTANT)
        self._log_params_hash = log_params_hash
        record = replay_membership or worker_env.replay_membership
        self._replay = MembershipReplay.load(record) if record else None
        self._step: Step | None = None  # the step being run, for its gradient's weight
        self._machine = TrainerMachine(ctx.rank)
        self.phase = phase_of(optimizer)
        self.phase.listener = ctx.report_phase
        self.phase.void_when = lambda: (self._machine.state is not TrainerState.TRAINING
                                        or (self.exchange is not None
                                            and self.exchange.failure is not None))
        self._recovery_path = worker_env.recovery_path
        self._events = EventLog(worker_env.log_dir, worker_env.node_rank)
        self._step_events = StepEvents(self._events, ctx.rank, ctx.world_size)
        self._injections = InjectedFaults(ctx, self.phase, self._events, self._clock)
        self._resume = resume or worker_env.is_recover or worker_env.restart_count > 0
        self._allow_world_size_change = allow_world_size_change
        self._epochs, self._max_steps = 0, 0  # what steps() was asked to run
        # An input, not a state: a stop signal noted, for the loop to act on.
        self._stops = StopSignals()

    @property
    def state(self) -> TrainerState:
        """Where the trainer is (docs/recovery.md draws the states and their moves)."""
        return self._machine.state

    # ------------------------------------------------------------------ the loop
    def steps(self, epochs: int, max_steps: int = 0) -> Iterator[Step]:
        """Yield every step still to run, recovering from faults in between.

        Args:
            epochs: train epochs 1..``epochs``.
            max_steps: stop after this global step (0: no limit).
        """
        handlers = {TrainerState.PAUSED: self._recover,
                    TrainerState.REPAIRING: self._repair_in_place,
                    TrainerState.STOPPING: self._stop}
        self._epochs, self._max_steps = epochs, max_steps
        self._update_total()
        with self._stops.noted() if self.modes.ttp else contextlib.nullcontext():
            if self.ctx.join_pending or self.ctx.generation > 0 or self._resume:
                # A relaunched rank, or a resumed job: take the state the others can give.
                self._machine.transition(TrainerState.RESYNCING)
                self._unless_stopped(self._join_and_resync)
            if self._machine.state is not TrainerState.STOPPING:
                if self.position.global_step == 0:
                    # A checkpoint of the initial state, so that a fault before the first
                    # periodic save still has a common point to roll back to.
                    self.saver.save(TrainPosition(self.position.epoch, 0, 0))
                self._machine.transition(TrainerState.TRAINING)
            schedule = self._schedule(epochs, max_steps)
            while (state := self._machine.state) is not TrainerState.FINISHED:
                if state is TrainerState.TRAINING:
                    step = next(schedule, None)
                    if step is None:
                        self._machine.transition(TrainerState.FINISHED)
                    else:
                        yield from self._run(step)
                else:
                    self._unless_stopped(handlers[state])  # to TRAINING at a new position,
                    schedule = self._schedule(epochs, max_steps)  # or STOPPING, or exits
            self.saver.train_end(*self.position)
        self._events.emit("train_end", rank=self.ctx.rank, step=self.position.global_step,
                          params_sha256=params_sha256(self.model))

    def _unless_stopped(self, handler: Callable[[], None]) -> None:
        """Run a state's handler; a wait it gives up on a stop signal leads to STOPPING."""
        try:
            handler()
        except Aborted as err:
            self._machine.fail(TrainerState.STOPPING, f"the job is being stopped: {err}")

    def _update_total(self) -> None:
        """The step events' ``total``: the global step the loop ends at if the current membership
        holds (counted from the cursor: under ``shrink`` a degraded epoch has more steps)."""
        position, sampler = self.position, self.sampler
        placed = (sampler.epoch == position.epoch
                  and sampler.cursor_step == position.step_in_epoch)
        cursor = sampler.cursor if placed else position.step_in_epoch * sampler.num_replicas
        live = len(self.ctx.active) or self.ctx.world_size

        def left(from_cursor: int) -> int:
            return steps_left(from_cursor, sampler.epoch_micro_batches, self.ctx.world_size,
                              live, self.batch_policy)

        total = (position.global_step + left(cursor)
                 + max(0, self._epochs - position.epoch) * left(0))
        self._step_events.total = min(total, self._max_steps) if self._max_steps else total

    def _schedule(self, epochs: int, max_steps: int) -> Iterator[Step]:
        """The steps from the current position on, each planned for the generation's live
        ranks from the epoch's cursor when it is reached (recovery/train/shares.py)."""
        start = self.position
        global_step = start.global_step
        sampler = self.sampler
        for epoch in range(start.epoch, epochs + 1):
            sampler.set_epoch(epoch)
            step_in_epoch = 0
            if epoch == start.epoch:
                step_in_epoch = start.step_in_epoch
                if sampler.cursor_step != step_in_epoch:
                    sampler.set_init_step(step_in_epoch)
            while (plan := plan_step(sampler.cursor, sampler.epoch_micro_batches,
                                     self.ctx.world_size, self.ctx.active,
                                     self.batch_policy)) is not None:
                if max_steps and global_step >= max_steps:
                    return
                global_step += 1
                step_in_epoch += 1
                share = plan.share(self.ctx.rank)
                yield Step(epoch, step_in_epoch, global_step,
                           indices=torch.cat([sampler.micro_batch(n) for n in share]),
                           share=share, micro_batch_size=sampler.batch_size,
                           divisor=plan.divisor, cursor=plan.next_cursor)

    def _run(self, step: Step) -> Iterator[Step]:
        """Hand ``step`` to the user's loop body; complete it if the trainer still trains."""
        self._injections.take(step.global_step)
        self._clock.start()
        self.phase.start_step(step.global_step)
        self._step = step
        if (leave := self._leaves_generation(step.global_step)) is not None:
            self._pause(leave)
        else:
            if self.exchange is not None:  # its buffers' broadcast may fail already
                self.exchange.begin(max(step.micro_batches, 1), step.divisor)
            if self.exchange is None or self.exchange.failure is None:
                yield step
            if self.exchange is not None and self.exchange.failure is not None:
                self._collective_failed(self.exchange.failure)
        if self._machine.state is TrainerState.TRAINING:
            self._complete(step)

    def _leaves_generation(self, global_step: int) -> str | None:
        """Why step ``global_step`` cannot start in this generation (the scheduler formed a newer
        one), or ``None``; in a replay the record decides, and this rank may die here."""
        if self.ctx.degraded:  # the dead ranks' return, soon: its steps are not all-reduced
            self.ctx.look_for_news()  # with them, so no blocked collective asks for news
        newer = self.ctx.latest_generation != self.ctx.generation
        if self._replay is None:
            return "the scheduler formed a new generation" if newer else None
        committed = self.position.global_step
        action = self._replay.before_step(self.ctx.rank, self.ctx.generation, committed, newer)
        if action is BeforeStep.KILL:
            logger.warning("[rank %d] replay: SIGKILL to myself before step %d: the record lost "
                           "this rank after step %d", self.ctx.rank, global_step, committed)
            os.kill(os.getpid(), signal.SIGKILL)
        if action is BeforeStep.LEAVE:
            return f"the generation after {self.ctx.generation} is due at step {committed}"
        return None

    def _replay_holds(self) -> bool:
        """Whether a newer generation must wait: the replay takes its ranks in later."""
        return self._replay is not None and self._replay.holds(self.ctx.generation,
                                                               self.position.global_step)

    def _check_replay(self) -> None:
        """Log how the generation just joined differs from the replayed record, if it does."""
        if self._replay is None:
            return
        diverged = self._replay.diverged(self.ctx.generation, self.ctx.active,
                                         self.position.global_step)
        if diverged is not None:
            logger.warning("[rank %d] replay diverged: %s", self.ctx.rank, diverged)

    def _complete(self, step: Step) -> None:
        """The step is done on this rank: record it, checkpoint, stop if asked to."""
        self.position = TrainPosition(*step)
        self.sampler.set_cursor(step.step_in_epoch, step.cursor)
        if self._log_params_hash:
            share = ",".join(map(str, step.share))
            logger.info("committed epoch=%d step=%d generation=%d world=%d cursor=%d "
                        "micro_batches=%s params_sha256=%s", step.epoch, step.global_step,
                        self.ctx.generation, len(self.ctx.active), step.cursor, share,
                        params_sha256(self.model))
        self.ctx.report_step(step.global_step)
        self.ctx.report_step_time(self._clock.finished() / max(step.micro_batches, 1))
        self._update_total()
        self._step_events.batch = step.divisor * step.micro_batch_size or None  # its samples
        self._step_events.completed(step.global_step, self.ctx.generation)
        self.saver.step_end(*step)
        if self._stops.request is not None:
            self._machine.fail(TrainerState.STOPPING, "the job is being stopped")

    # ------------------------------------------------------------------ collectives
    def all_reduce_gradients(self) -> None:
        """Average the gradients over the group (in a degraded step, over its micro-batches). On a fault it
        returns without raising: the step is void (the optimizer update that follows does nothing) and the
        loop recovers before the next step."""
        if self.exchange is not None:
            raise RuntimeError("the DistributedDataParallel model's gradients are reduced "
                               "during backward(): do not call all_reduce_gradients()")
        if self._machine.state is not TrainerState.TRAINING:
            return
        self._reached_collective()
        self._injections.raise_uce()
        self._clock.collective_started()
        damaged = self.phase.device_error
        if damaged is not None and not self.modes.uce:
            raise damaged  # in-place recovery is off: the rank dies and is relaunched
        flags = torch.zeros(self.ctx.world_size)
        flags[self.ctx.rank] = 1.0 if damaged else 0.0
        step = self._step
        try:
            # Weighted by this rank's micro-batches, over the step's (recovery/train/shares.py).
            all_reduce_gradients(self.model.parameters(), flags=flags, wait=self._wait,
                                 weight=max(step.micro_batches, 1) if step else 1,
                                 divisor=(step.divisor or None) if step else None)
        except (PeerFailure, Aborted) as failure:
            self._collective_failed(failure)
            return
        self._clock.collective_ended()
        faulty = frozenset(int(r) for r in torch.nonzero(flags).flatten())
        if damaged is not None and dist.get_world_size() == 1:
            faulty = frozenset({self.ctx.rank})
        if faulty:
            self._machine.fail(TrainerState.REPAIRING, "a device failed", faulty)

    def _reached_collective(self) -> None:
        # Reaching the step's collective is progress: a rank stuck before it (hung) stays
        # behind the others in the scheduler's eyes, so its progress verdict names it.
        self.ctx.report_step(self.phase.global_step)

    def _collective_failed(self, failure: BaseException) -> None:
        """The step's gradient exchange failed: pause on a lost peer, stop on a stop signal."""
        if isinstance(failure, Aborted):
            self._machine.fail(TrainerState.STOPPING,
                               "the job is being stopped, and the step's collective is stuck")
        else:
            self._pause(str(failure))

    def _pause(self, cause: str) -> None:
        self._machine.fail(TrainerState.PAUSED, cause)
        self._step_events.reached(self.position.global_step, self.ctx.generation, PAUSED)
        logger.warning("[rank %d] peer failure in generation %d: %s", self.ctx.rank,
                       self.ctx.generation, cause)

    def _wait(self, work: Any) -> None:
        """How the trainer waits for a collective (see :func:`wait_collective`)."""
        wait_collective(work, self.ctx, self._stops.should_abort, self._replay_holds)

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        """PAUSED: last words, join the next generation, resynchronise (or stop)."""
        fault = self._machine.fault
        assert fault is not None
        if self.modes.ttp:
            self._machine.transition(TrainerState.SAVING_LAST_WORDS)
            self._save_last_words(fault.cause)
            if self._stops.request is not None:
                self._exit("the job is being stopped")
        self._machine.transition(TrainerState.REFORMING)
        self.ctx.rejoin(self._stops.should_abort)
        self._machine.transition(TrainerState.RESYNCING)
        self._resync(newcomer=False)
        self._check_replay()
        self._machine.transition(TrainerState.TRAINING)

    def _save_last_words(self, why: str) -> None:
        """If this rank is consistent and the scheduler picks it, save every rank's last words."""
        consistent = self.phase.consistent
        reason = "" if consistent else "mid-update: its state is half-updated"
        global_step = self.position.global_step
        if global_step == 0:
            # The initial checkpoint holds step 0 already; and a rank still at step 0 (a
            # relaunched rank stopped before it took a state) leaves the claim to one
            # that holds more.
            return
        if not self.ctx.claim_last_words(global_step, consistent, reason):
            if not consistent:
                self._events.emit("last_words_skipped", rank=self.ctx.rank, step=global_step,
                                  reason=reason)
            return
        self.saver.wait()
        started = time.monotonic()
        path = save_last_words(self.saver, self._recovery_path, self.position, self.ctx.world_size)
        self._events.emit("last_words_saved", rank=self.ctx.rank, step=global_step,
                          epoch=self.position.epoch, step_in_epoch=self.position.step_in_epoch,
                          path=str(path), ranks=self.ctx.world_size, why=why,
                          seconds=round(time.monotonic() - started, 3))

    def _stop(self) -> None:
        """STOPPING: save the last words if this rank may, and exit."""
        fault = self._machine.fault
        why = fault.cause if fault is not None else "the job is being stopped"
        if self.modes.ttp:
            self._machine.transition(TrainerState.SAVING_LAST_WORDS)
            self._save_last_words(why)
        self._exit(why)

    def _exit(self, why: str) -> None:
        """End this process on the stop signal (status 128 + signal); the group is left first, which
        never waits for a collective still in flight on a stuck peer."""
        self._machine.transition(TrainerState.STOPPED)
        self.ctx.leave_group()
        request = self._stops.request
        status = 128 + (request.signum if request is not None else signal.SIGTERM)
        self.ctx.stop_status = status
        logger.warning("[rank %d] stopping at step %d: %s", self.ctx.rank,
                       self.position.global_step, why)
        raise SystemExit(status)

    def _join_and_resync(self) -> None:
        """A newcomer's first resync; a relaunched rank joins only now that its model and
        data are built, so the others wait only for the state transfer (docs/elastic.md)."""
        if self.ctx.join_pending:
            self.ctx.complete_join(self._stops.should_abort)
        self._resync(newcomer=True)
        self._check_replay()

    def _resync(self, newcomer: bool) -> None:
        """In a freshly joined group: take the newest consistent replica's state, or roll back."""
        self.saver.wait()
        if self.exchange is not None:
            self.exchange.follow_group()
        consistent = not newcomer and self.phase.consistent
        reports = gather_reports(ReplicaReport(self.ctx.rank, consistent, self.position.global_step),
                                 self._wait)
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
        def behind(report: ReplicaReport) -> bool:
            return (report.rank in damaged or not report.consistent
                    or report.global_step != source.global_step)

        receive = behind(next(r for r in reports if r.rank == self.ctx.rank))
        if not any(behind(report) for report in reports):
            # Every member holds the source's state (survivors re-forming after a death):
            # nothing to send.
            self._after_restore(label, from_rank=source.rank)
            return
        state: dict[str, Any] | None = self.saver.state(self.position)
        most = state_limit(state)
        if self.ctx.rank != source.rank:
            state = None  # read only on the source; a receiver keeps no reference to what it discards
        if receive and self.ctx.rank in damaged:
            self._discard_state()
        state = broadcast_plain(state, self.ctx.active.index(source.rank), most, self._wait)
        if receive:
            self.position = restore_checkpoint(
                state, self.model, self.optimizer, self.lr_scheduler, sampler=self.sampler,
                rng=self.saver.rng, allow_world_size_change=self._allow_world_size_change)
        self._after_restore(label, from_rank=source.rank)

    def _discard_state(self) -> None:
        """Drop the damaged rank's parameters and optimizer state, re-allocating the storage."""
        with torch.no_grad():
            for param in self.model.parameters():
                param.data = torch.empty_like(param.data)
        self.optimizer.state.clear()

    def _repair_in_place(self) -> None:
        """REPAIRING: every rank voided this step; repair the faulty ranks from a healthy
        one, and redo it."""
        fault = self._machine.fault
        assert fault is not None
        damaged = fault.ranks
        reports = gather_reports(ReplicaReport(self.ctx.rank, self.phase.consistent
                                               and self.ctx.rank not in damaged,
                                               self.position.global_step), self._wait)
        source = choose_source(reports, excluded=damaged)
        if source is not None:
            self._copy_from_replica(source, reports, "in_place", damaged)
        else:
            self._emit_as_leader("fallback", mode="in_place", to="checkpoint",
                                 reason="no healthy replica: every rank's device failed")
            self._roll_back()
        self.phase.device_error = None
        self._machine.transition(TrainerState.TRAINING)

    def _roll_back(self) -> None:
        """Restore the newest checkpoint every rank holds (or the start, if none)."""
        directories = checkpoint_dirs(self.saver, self._recovery_path, self.ctx.rank)
        chosen = choose_rollback(directories, self.saver.lineage, self._wait)
        if chosen is None:
            if self.ctx.generation == 0:
                logger.info("no checkpoint common to every rank: starting from the beginning")
                return
            raise RuntimeError("the ranks hold no checkpoint in common: cannot roll back")
        candidate, state = chosen
        self.position = restore_checkpoint(
            state, self.model, self.optimizer, self.lr_scheduler,
            sampler=self.sampler, rng=self.saver.rng, path=candidate.path,
            allow_world_size_change=self._allow_world_size_change)
        logger.info("resumed from %s (epoch %d, step %d, global step %d)", candidate.path,
                    self.position.epoch, self.position.step_in_epoch, self.position.global_step)
        last_words = candidate.kind is CheckpointKind.LAST_WORDS
        self._after_restore("last_words" if last_words else "checkpoint", epoch=candidate.epoch,
                            step_in_epoch=candidate.step_in_epoch)

    def _after_restore(self, source: str, **fields: Any) -> None:
        """Record where training goes on: this rank's ``step`` event, and (rank 0) the
        ``rollback``/``recovered`` events."""
        self._update_total()
        self._step_events.reached(self.position.global_step, self.ctx.generation, RESTORED)
        self._emit_as_leader("rollback", step=self.position.global_step, source=source,
                             generation=self.ctx.generation, **fields)
        self._emit_as_leader("recovered", generation=self.ctx.generation,
                             step=self.position.global_step, source=source,
                             seconds=round(time.time() - self._fault_time(), 3))

    def _emit_as_leader(self, event: str, **fields: Any) -> None:
        if self.ctx.group_rank == 0:  # the ranks agree on it: emitted once
            self._events.emit(event, **fields)

    def _fault_time(self) -> float:
        """When the fault recovered from happened, from what this process holds, never events.jsonl (it
        grows with the job's age): the scheduler's time of the newest fault, but for a device error
        repaired in place."""
        fault = self._machine.fault
        if fault is not None and fault.ranks:
            return fault.at
        if self.ctx.fault_at is not None:
            return self.ctx.fault_at
        return fault.at if fault is not None else time.time()
