"""tftrun's recovery for PyTorch Lightning (docs/frameworks.md). ``strategy=RestartableDDP()``:
survivors write their last words and call ``fit`` again in the same process.
``callbacks=[..., LastWordsCheckpoint()]`` with ``strategy="ddp"``: the last words alone, for a
group restart. No collective is run, since the peer is dead."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
from lightning.pytorch.strategies.launchers.launcher import _Launcher
from lightning.pytorch.trainer import call
from lightning.pytorch.trainer.states import TrainerFn, TrainerStatus

from recovery import env as names
from recovery.ckpt.durable import write_atomic
from recovery.env import WorkerEnv
from recovery.peer_loss import StopRequest, first_line, is_peer_loss
from recovery.runtime.restartable import Restarts, on_next_fault

__all__ = ["LastWordsCheckpoint", "RestartableDDP"]

logger = logging.getLogger(__name__)


class LastWordsCheckpoint(Callback):
    """Writes ``last.ckpt`` where the job's ``ModelCheckpoint(save_last=True)`` keeps it (or
    ``dirpath/last.ckpt``) when a collective fails on a dead peer or tftrun stops the group
    (SIGTERM, acted on at the next step boundary)."""

    def __init__(self, dirpath: str | Path | None = None) -> None:
        self.dirpath = None if dirpath is None else Path(dirpath)
        self._stop = StopRequest()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        if isinstance(strategy, DeepSpeedStrategy) or not isinstance(strategy, DDPStrategy | SingleDeviceStrategy):
            # A sharded state is gathered by collectives, which the dead peer would never join.
            raise ValueError(f"LastWordsCheckpoint works with strategy='ddp', not {type(strategy).__name__}")
        if self.dirpath is None and _saving_last(trainer) is None:
            raise ValueError("LastWordsCheckpoint needs a dirpath, or a ModelCheckpoint with save_last=True "
                             "to write its last.ckpt")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop.install()  # after Lightning's own handler, which the trainer sets just before

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop.restore()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._stop_if_requested(trainer)

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: torch.Tensor) -> None:
        self._stop_if_requested(trainer)  # before backward's all-reduce, which would wait on the dead peer

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        self._stop_if_requested(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        if is_peer_loss(exception):
            self.save(trainer, first_line(exception))
        self._stop.default_action()

    def save(self, trainer: pl.Trainer, why: str = "SIGTERM") -> Path:
        """Write the trainer's state as Lightning's checkpoint: that of ``trainer.global_step``
        completed steps, since a death inside a step's backward leaves the optimizer step
        untaken."""
        path = self.last_path(trainer)
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda file: torch.save(checkpoint, file))
        logger.warning("recovery.lightning: last words at step %d written to %s (%s)", trainer.global_step, path,
                       why)
        return path

    def _stop_if_requested(self, trainer: pl.Trainer) -> None:
        if self._stop.requested:
            self.save(trainer)
            self._stop.default_action()

    def last_path(self, trainer: pl.Trainer) -> Path:
        """Where the last words go."""
        if self.dirpath is not None:
            return self.dirpath / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"
        saver = _saving_last(trainer)
        assert saver is not None, "setup() checked it"
        if saver.last_model_path:
            return Path(saver.last_model_path)
        return Path(saver.format_checkpoint_name(saver._monitor_candidates(trainer), saver.CHECKPOINT_NAME_LAST))


def _saving_last(trainer: pl.Trainer) -> ModelCheckpoint | None:
    """The job's checkpoint callback that keeps a ``last.ckpt`` (where its resume looks)."""
    return next((c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.save_last), None)


class RestartableDDP(DDPStrategy):
    """Lightning's DDP, whose ``fit`` is called again in the surviving processes when a peer
    dies; outside tftrun (plain torchrun, a single process) it is Lightning's DDP."""

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        self._launcher = _RestartingLauncher(self._launcher)


class _RestartingLauncher(_Launcher):
    """Wraps Lightning's launcher: under tftrun, ``fit`` is called once per whole generation."""

    def __init__(self, inner: _Launcher | None) -> None:
        self._inner = inner

    @property
    def is_interactive_compatible(self) -> bool:
        return False

    def kill(self, signum: Any) -> None:
        if self._inner is not None:
            self._inner.kill(signum)

    def launch(self, function: Callable[..., Any], *args: Any, trainer: pl.Trainer, **kwargs: Any) -> Any:
        if names.MS_SCHED_PORT not in os.environ or trainer.state.fn is not TrainerFn.FITTING:
            if self._inner is not None:
                return self._inner.launch(function, *args, trainer=trainer, **kwargs)
            return function(*args, **kwargs)
        return _FitCalls(trainer, function, inspect.signature(function).bind(*args, **kwargs)).run()


class _FitCalls:
    """One rank's calls of ``fit``: each after the first resumes from the last words."""

    def __init__(self, trainer: pl.Trainer, fit: Callable[..., Any], arguments: inspect.BoundArguments) -> None:
        self._trainer = trainer
        self._fit = fit
        self._arguments = arguments
        self._words = _last_words_of(trainer)
        self._worker_env = WorkerEnv.from_env()
        self._calls = 0

    def run(self) -> Any:
        path = self._words.last_path(self._trainer)
        worker_env = self._worker_env
        recovering = worker_env.incarnation > 0 or worker_env.restart_count > 0 or worker_env.is_recover
        if not recovering:
            # An earlier job's, in a folder this job reuses: no rank writes before all have joined.
            path.unlink(missing_ok=True)
        return Restarts("fit", worker_env).run(lambda: self._call(path, recovering))

    def _call(self, path: Path, recovering: bool) -> Any:
        self._calls += 1
        on_next_fault(self._after_fault)
        arguments = self._arguments.arguments
        if self._calls > 1 or recovering:
            arguments["ckpt_path"] = _newer(path, arguments.get("ckpt_path"))
        if self._calls > 1:
            trainer = self._trainer
            trainer.state.fn, trainer.state.status = TrainerFn.FITTING, TrainerStatus.RUNNING
            trainer.training, trainer.should_stop = True, False
        return self._fit(*self._arguments.args, **self._arguments.kwargs)

    def _after_fault(self, error: BaseException) -> None:
        """What Lightning does with a failed ``fit`` (the last words among it), short of raising."""
        call._interrupt(self._trainer, error)
        self._trainer._teardown()
        self._trainer.state.stage = None


def _last_words_of(trainer: pl.Trainer) -> LastWordsCheckpoint:
    """The trainer's :class:`LastWordsCheckpoint`, or one added that writes in the recovery
    folder."""
    for callback in trainer.callbacks:
        if isinstance(callback, LastWordsCheckpoint):
            return callback
    words = LastWordsCheckpoint(Path(WorkerEnv.from_env().recovery_path) / "lightning")
    trainer.callbacks.append(words)
    return words


def _newer(last_words: Path, ckpt_path: Any) -> Any:
    """The checkpoint to resume from: the last words, unless the script's own is newer."""
    if not last_words.exists():
        return ckpt_path
    if isinstance(ckpt_path, str | os.PathLike) and Path(ckpt_path).is_file() \
            and Path(ckpt_path).stat().st_mtime > last_words.stat().st_mtime:
        return ckpt_path
    return str(last_words)
