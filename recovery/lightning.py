"""Last words for PyTorch Lightning: on a peer's death, a survivor writes Lightning's own
``last.ckpt`` of the last completed step, so that the group restart redoes no step.

    trainer = L.Trainer(strategy="ddp", callbacks=[ModelCheckpoint(dirpath="ckpt", save_last=True),
                                                   LastWordsCheckpoint()])

Every survivor writes (a survivor does not know which peer died, and every DDP replica
holds the same state), each through its own temporary file renamed over the final name,
so a reader sees one complete checkpoint, never a torn one. No collective or barrier is
run: the peer is dead (``Trainer.save_checkpoint`` would wait for it at its barrier).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy

from recovery.ckpt.durable import write_atomic
from recovery.peer_loss import StopRequest, first_line, is_peer_loss

__all__ = ["LastWordsCheckpoint"]

logger = logging.getLogger(__name__)


class LastWordsCheckpoint(Callback):
    """Writes ``last.ckpt`` where the job's ``ModelCheckpoint(save_last=True)`` keeps it
    (or ``dirpath/last.ckpt``) when a collective fails on a dead peer or tftrun stops the
    group (SIGTERM, acted on at the next step boundary)."""

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

    def save(self, trainer: pl.Trainer, why: str = "SIGTERM") -> Path | None:
        """Write the trainer's state as Lightning's checkpoint; ``None`` before the first step.

        A death inside a step's backward leaves the optimizer step untaken: the state is
        that of ``trainer.global_step`` completed steps, and Lightning resumes there.
        """
        if trainer.global_step == 0:
            return None
        path = self._last_path(trainer)
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

    def _last_path(self, trainer: pl.Trainer) -> Path:
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
