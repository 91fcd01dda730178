"""Last words for the Hugging Face Trainer (docs/frameworks.md): on a peer's death, every
survivor writes the Trainer's own ``checkpoint-<step>`` folder of the last completed step,
running no collective: none knows which peer died, and the Trainer's own save writes on
process 0 only, which may be the dead one."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import safetensors.torch
import torch
from transformers import PreTrainedModel, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer import OPTIMIZER_NAME, SCALER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME, TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import SAFE_WEIGHTS_NAME

from recovery.ckpt.durable import fsync_dir
from recovery.ckpt.layout import temp_path
from recovery.peer_loss import StopRequest, first_line, is_peer_loss
from recovery.runtime.restartable import on_next_fault

__all__ = ["LastWordsCallback", "write_dir_atomic"]

logger = logging.getLogger(__name__)


@dataclass
class _Training:
    """What the checkpoint is made of, as the Trainer hands it to its callbacks."""

    args: TrainingArguments
    state: TrainerState
    model: torch.nn.Module
    optimizer: Any
    lr_scheduler: Any
    processing_class: Any
    rng_states: dict[str, Any] | None = None
    """The RNG states at the end of the last completed step: a step cut short by a death
    has drawn from them already."""


class LastWordsCallback(TrainerCallback):
    """Writes ``<output_dir>/checkpoint-<global_step>`` when a collective fails on a dead
    peer or tftrun stops the group (SIGTERM, acted on at the next step boundary)."""

    def __init__(self) -> None:
        self._stop = StopRequest()
        self._training: _Training | None = None
        self._previous_hook: Callable[..., Any] | None = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        if args.deepspeed or args.fsdp:
            # A sharded state is gathered by collectives, which the dead peer would never join.
            logger.warning("recovery.hf: LastWordsCallback writes nothing under DeepSpeed or FSDP")
            return
        self._training = _Training(args, state, kwargs["model"], kwargs.get("optimizer"),
                                   kwargs.get("lr_scheduler"), kwargs.get("processing_class"))
        self._stop.install()
        if not on_next_fault(self._on_peer_fault) and self._previous_hook is None:
            self._previous_hook, sys.excepthook = sys.excepthook, self._on_uncaught

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._end()

    def _end(self) -> None:
        self._stop.restore()
        if self._previous_hook is not None:
            sys.excepthook, self._previous_hook = self._previous_hook, None
        self._training = None

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        self._stop_if_requested()  # before the step's backward, whose all-reduce would wait on the dead peer

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        if self._training is not None:
            self._training.rng_states = _rng_states(args)
        self._stop_if_requested()

    def save(self, why: str = "SIGTERM") -> Path | None:
        """Write the training's state as the Trainer's checkpoint, or return ``None`` before
        the first step or outside training. A death inside a step's backward leaves the
        optimizer step untaken, so the state is that of ``state.global_step`` completed
        steps."""
        training = self._training
        if training is None or training.rng_states is None:
            return None
        path = Path(training.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{training.state.global_step}"
        write_dir_atomic(path, lambda folder: _write_checkpoint(training, folder))
        logger.warning("recovery.hf: last words at step %d written to %s (%s)", training.state.global_step, path, why)
        return path

    def _stop_if_requested(self) -> None:
        if self._stop.requested:
            self.save()
            self._stop.default_action()

    def _on_peer_fault(self, error: BaseException) -> None:
        """A peer's fault ended this restartable call: last words, and the training is over."""
        try:
            if is_peer_loss(error):
                self.save(first_line(error))
        finally:
            self._end()

    def _on_uncaught(self, kind: type[BaseException], error: BaseException,
                     traceback: TracebackType | None) -> None:
        try:
            if is_peer_loss(error):
                self.save(first_line(error))
        finally:
            assert self._previous_hook is not None
            self._previous_hook(kind, error, traceback)
            self._stop.default_action()


def _write_checkpoint(training: _Training, folder: Path) -> None:
    """The files of the Trainer's ``_save_checkpoint``, written by this process alone."""
    model = training.model.module if isinstance(training.model, torch.nn.parallel.DistributedDataParallel) \
        else training.model
    # Not save_pretrained: it writes on rank 0 only, and rank 0 may be the dead one. The
    # Trainer's resume loads these weights with load_state_dict (strict=False: tied ones
    # written once).
    safetensors.torch.save_model(model, str(folder / SAFE_WEIGHTS_NAME), metadata={"format": "pt"})
    if isinstance(model, PreTrainedModel):
        model.config.save_pretrained(folder)
    if training.processing_class is not None:
        training.processing_class.save_pretrained(folder)
    torch.save(training.args, folder / TRAINING_ARGS_NAME)
    if training.optimizer is not None:
        torch.save(training.optimizer.state_dict(), folder / OPTIMIZER_NAME)
        if getattr(training.optimizer, "scaler", None) is not None:
            torch.save(training.optimizer.scaler.state_dict(), folder / SCALER_NAME)
    if training.lr_scheduler is not None:
        torch.save(training.lr_scheduler.state_dict(), folder / SCHEDULER_NAME)
    # This process's RNG states as every process's file: the Trainer seeds every process
    # alike, and a dead process's own states are gone with it.
    world = training.args.world_size
    for name in [f"rng_state_{i}.pth" for i in range(world)] if world > 1 else ["rng_state.pth"]:
        torch.save(training.rng_states, folder / name)
    training.state.save_to_json(str(folder / TRAINER_STATE_NAME))


def _rng_states(args: TrainingArguments) -> dict[str, Any]:
    """This process's RNG states, in the form of the Trainer's ``rng_state*.pth`` files."""
    states: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                              "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = (torch.cuda.random.get_rng_state_all() if args.world_size > 1
                          else torch.cuda.random.get_rng_state())
    return states


def write_dir_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Fill a fresh temporary folder beside ``path`` with ``write``, make it durable and rename
    it over ``path``: a reader sees the old folder, none, or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path(path)
    temp.mkdir(mode=0o755)
    aside: list[Path] = []
    renamed = False
    try:
        write(temp)
        for file in temp.rglob("*"):
            if file.is_file():
                with open(file, "rb") as handle:
                    os.fsync(handle.fileno())
        fsync_dir(temp)
        for attempt in range(_RENAME_TRIES):
            if path.exists():
                aside.append(temp_path(path, tag="old"))
                with contextlib.suppress(FileNotFoundError):
                    path.rename(aside[-1])
            try:
                temp.rename(path)
                renamed = True
                break
            except OSError as err:
                if err.errno not in (errno.ENOTEMPTY, errno.EEXIST) or attempt == _RENAME_TRIES - 1:
                    raise
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    finally:
        if not renamed and aside and not path.exists():
            with contextlib.suppress(OSError):
                aside.pop().rename(path)  # the folder this writer moved aside, back in its place
        for old in aside:
            shutil.rmtree(old, ignore_errors=True)
    fsync_dir(path.parent)


_RENAME_TRIES = 5
