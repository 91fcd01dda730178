"""Periodic checkpoints in the spirit of MindSpore's ``CheckpointConfig``/``ModelCheckpoint``.

With ``async_save`` a forked writer process writes them, off the training process's GIL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from recovery.ckpt import layout, staging
from recovery.ckpt.durable import remove_stale_temps, write_atomic
from recovery.ckpt.lineage import job_lineage
from recovery.ckpt.manifest import CheckpointEntry, CheckpointError, CheckpointKind, KeepRule, Manifest
from recovery.ckpt.restore import FORMAT, FORMAT_VERSION, ResumePoint, job_rank_and_world_size, resume
from recovery.ckpt.writer_process import WriteRequest, WriterProcess
from recovery.env import WorkerEnv
from recovery.position import TrainPosition
from recovery.rng import GlobalRngState
from recovery.stateful import Stateful

__all__ = ["CheckpointConfig", "CheckpointSaver", "write_checkpoint"]

logger = logging.getLogger(__name__)

EPOCH_NUM = "epoch_num"
STEP_NUM = "step_num"
_USER_VALUE_TYPES = (bool, int, float, str, torch.Tensor)
# What torch.load(weights_only=True) rebuilds besides containers and tensors.
_PLAIN_TYPES = (str, int, float, bool, type(None), torch.Size, torch.dtype, torch.device)


def _normalize_append_info(append_info: Sequence[str | Mapping[str, Any]] | None) -> tuple[str | dict[str, Any], ...]:
    if append_info is None:
        return ()
    if isinstance(append_info, (str, Mapping)) or not isinstance(append_info, Sequence):
        raise TypeError(
            f"append_info must be a list such as ['epoch_num', 'step_num', {{'lr': 0.01}}], got {append_info!r}"
        )
    items: list[str | dict[str, Any]] = []
    for item in append_info:
        if isinstance(item, str):
            if item not in (EPOCH_NUM, STEP_NUM):
                raise ValueError(f"append_info entry {item!r} is unknown: use 'epoch_num', 'step_num' or a dict")
            items.append(item)
        elif isinstance(item, Mapping):
            if any(isinstance(other, dict) for other in items):
                raise ValueError("append_info takes at most one dict of user values")
            items.append(_checked_user_values(item))
        else:
            raise TypeError(f"append_info entry {item!r} has type {type(item).__name__}: "
                            "use 'epoch_num', 'step_num' or a dict")
    return tuple(items)


def _checked_user_values(values: Mapping[Any, Any]) -> dict[str, Any]:
    for key, value in values.items():
        if not isinstance(key, str):
            raise TypeError(f"append_info key {key!r} has type {type(key).__name__}: it must be a str")
        if key in (EPOCH_NUM, STEP_NUM):
            raise ValueError(f"append_info key {key!r} is reserved: list it as the string {key!r} instead")
        if not isinstance(value, _USER_VALUE_TYPES):
            raise TypeError(
                f"append_info value of {key!r} has type {type(value).__name__}: "
                "it must be an int, float, bool, str or torch.Tensor"
            )
    return dict(values)


@dataclass(frozen=True)
class CheckpointConfig:
    """When to save, how many to keep, what to add, and whether to write in the background.

    Args:
        save_checkpoint_steps: save when the global step is a multiple of this (0: never).
        save_checkpoint_epochs: save at the end of an epoch whose number is a multiple of this (0: never).
        keep_checkpoint_max: checkpoints of the prefix to keep (the rank's earlier incarnations' too), and
            last-words saves to keep; the oldest goes only once a newer one is durable.
        append_info: ``"epoch_num"``, ``"step_num"`` (the global step) and at most one dict of str keys to
            int, float, bool, str or tensor values.
        async_save: write from a background writer process.
    """

    save_checkpoint_steps: int = 1
    save_checkpoint_epochs: int = 0
    keep_checkpoint_max: int = 5
    append_info: Sequence[str | Mapping[str, Any]] | None = None
    async_save: bool = False

    def __post_init__(self) -> None:
        for name in ("save_checkpoint_steps", "save_checkpoint_epochs", "keep_checkpoint_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.keep_checkpoint_max < 1:
            raise ValueError("keep_checkpoint_max must be >= 1")
        if self.save_checkpoint_steps == 0 and self.save_checkpoint_epochs == 0:
            raise ValueError("save_checkpoint_steps and save_checkpoint_epochs cannot both be 0")
        object.__setattr__(self, "append_info", _normalize_append_info(self.append_info))

    def append_values(self, position: TrainPosition) -> dict[str, Any]:
        """The ``append_info`` a checkpoint at ``position`` holds."""
        values: dict[str, Any] = {}
        for item in self.append_info or ():
            if item == EPOCH_NUM:
                values[EPOCH_NUM] = position.epoch
            elif item == STEP_NUM:
                values[STEP_NUM] = position.global_step
            else:
                values.update(item)  # type: ignore[arg-type]
        return values


class _NotPlain(Exception):
    """A value a checkpoint cannot hold; ``path`` grows key by key as it is raised, so that the
    walk builds no path strings while everything is plain."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self.value = value
        self.path = ""


def _same(tensor: torch.Tensor) -> Any:
    return tensor


def _plain(obj: Any, tensor: Callable[[torch.Tensor], Any] = _same) -> Any:
    """``obj`` as a fresh tree of containers, each tensor replaced by ``tensor(it)``; raises CheckpointError
    for anything but tensors and plain data, before a ``weights_only`` load would."""
    try:
        return _plain_tree(obj, tensor)
    except _NotPlain as err:
        raise CheckpointError(
            f"checkpoint{err.path} has type {type(err.value).__name__}: a checkpoint holds only tensors and plain "
            "data (so that it loads with weights_only=True)"
        ) from None


def _plain_tree(obj: Any, tensor: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(obj, torch.Tensor):
        return tensor(obj)
    if isinstance(obj, _PLAIN_TYPES):
        return obj
    if isinstance(obj, dict):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for key, value in obj.items():
            if not isinstance(key, _PLAIN_TYPES):
                try:
                    _plain_tree(key, _same)
                except _NotPlain as err:
                    err.path = f" key{err.path}"
                    raise
            try:
                out[key] = _plain_tree(value, tensor)
            except _NotPlain as err:
                err.path = f"[{key!r}]{err.path}"
                raise
        return out
    if type(obj) in (list, tuple):
        items = []
        for index, value in enumerate(obj):
            try:
                items.append(_plain_tree(value, tensor))
            except _NotPlain as err:
                err.path = f"[{index}]{err.path}"
                raise
        return type(obj)(items)
    raise _NotPlain(obj)


def write_checkpoint(
    directory: Path, name: str, state: dict[str, Any], position: TrainPosition, manifest: Manifest,
    keep: KeepRule | None = None, kind: CheckpointKind = CheckpointKind.PERIODIC,
) -> list[str]:
    """Write ``state`` as ``directory/name`` durably, then list it in ``manifest``; return the names ``keep``
    dropped, which leave the manifest first and are then unlinked unsynced: an undone unlink leaves a file
    unlisted."""
    spare = layout.spare_path(directory)
    digest = write_atomic(directory / name, lambda file: torch.save(state, file), reuse=spare)
    entry = CheckpointEntry(
        name, *position, state["rank"], state["world_size"], digest.size, digest.checksum,
        time.time(), lineage=state.get("lineage"), kind=kind,
    )
    stale = manifest.add(entry, keep=keep)
    for stale_name in stale:
        if stale_name == stale[-1] and not spare.exists():
            # Kept for the next save to write over, rather than freed and allocated anew.
            with contextlib.suppress(FileNotFoundError):
                os.replace(directory / stale_name, spare)
        (directory / stale_name).unlink(missing_ok=True)
    return stale


class _StagedWriter:
    """In the writer process: write one staged checkpoint as :func:`write_checkpoint` does.

    The manifest object is made in the writer process, since its file lock must not cross the fork."""

    def __init__(self, directory: Path, keep: KeepRule) -> None:
        self.directory = directory
        self.keep = keep
        self._manifest: Manifest | None = None
        self._rebuild = staging.Rebuilder()

    def __call__(self, request: WriteRequest, buffer: Any) -> list[str]:
        if self._manifest is None:
            self._manifest = Manifest(self.directory)
        state = self._rebuild(buffer, request.specs, request.skeleton)
        return write_checkpoint(self.directory, request.name, state, request.position, self._manifest,
                                keep=self.keep)


class CheckpointSaver:
    """Saves checkpoints of a model (and optimizer, scheduler, RNGs, data position).

    Args:
        config: ``CheckpointConfig()`` if ``None``.
        prefix: the file-name prefix; a later run in the same directory writes ``<prefix>_<n>-...``.
        directory: this rank's; by default ``<recovery path>/checkpoints/rank_<rank>``.
        sampler: a :class:`~recovery.stateful.Stateful` recorded with the data position, restored by
            :meth:`resume`.
        rng: by default :class:`~recovery.rng.GlobalRngState`.
        lineage: stamped into every checkpoint, the only one :meth:`resume` considers; by default this job's.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        *,
        config: CheckpointConfig | None = None,
        prefix: str = "checkpoint",
        directory: str | os.PathLike[str] | None = None,
        sampler: Stateful | None = None,
        rng: Stateful | None = None,
        lineage: str | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.sampler = sampler
        self.rng = rng if rng is not None else GlobalRngState()
        self.config = config or CheckpointConfig()
        self.rank, self.world_size = job_rank_and_world_size()
        self.lineage = lineage or job_lineage()
        if directory is None:
            directory = layout.rank_dir(WorkerEnv.from_env().recovery_path, self.rank)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.directory)
        self.manifest = Manifest(self.directory)
        self.prefix = layout.run_prefix(layout.check_prefix(prefix),
                                        [*os.listdir(self.directory), *self.manifest.entries()])
        self.keep_rule = KeepRule(prefix, self.lineage, self.config.keep_checkpoint_max)
        self._writer = WriterProcess(_StagedWriter(self.directory, self.keep_rule)) if self.config.async_save else None
        self._stage = staging.SharedStage() if self.config.async_save else None
        self._last_saved: int | None = None

    # -- a plain training loop ------------------------------------------------------------

    def step_end(self, epoch: int, step_in_epoch: int, global_step: int) -> Path | None:
        """Call after each step, ``epoch`` and ``step_in_epoch`` counted from 1; saves every
        ``save_checkpoint_steps`` global steps. Returns the path saved (with ``async_save``, being written)
        or None; raises CheckpointError if this save or an earlier background write failed."""
        if self._writer is not None:
            self._writer.raise_if_failed()
        every = self.config.save_checkpoint_steps
        if every and global_step % every == 0:
            return self.save(TrainPosition(epoch, step_in_epoch, global_step))
        return None

    def epoch_end(self, epoch: int, step_in_epoch: int, global_step: int) -> Path | None:
        """Call after each epoch; saves every ``save_checkpoint_epochs`` epochs.

        Arguments, return value and errors as for :meth:`step_end`.
        """
        if self._writer is not None:
            self._writer.raise_if_failed()
        every = self.config.save_checkpoint_epochs
        if every and epoch % every == 0 and global_step != self._last_saved:
            return self.save(TrainPosition(epoch, step_in_epoch, global_step))
        return None

    def train_end(self, epoch: int, step_in_epoch: int, global_step: int) -> Path | None:
        """Call when training ends normally: saves the last step if not saved yet, then waits for the write.

        Arguments, return value and errors as for :meth:`step_end`.
        """
        saved = (None if global_step == self._last_saved
                 else self.save(TrainPosition(epoch, step_in_epoch, global_step)))
        self.close()
        return saved

    def save(self, position: TrainPosition) -> Path:
        """Save a checkpoint of the current state, the result of ``position``, now; return its path.

        With ``async_save`` the write may still be going on. Errors as for :meth:`step_end`.
        """
        name = layout.checkpoint_name(self.prefix, position)
        if self._writer is None or self._stage is None:
            try:
                stale = write_checkpoint(self.directory, name, self.state(position), position, self.manifest,
                                         keep=self.keep_rule)
            except OSError as err:
                raise CheckpointError(f"writing checkpoint {self.directory / name} failed: {err}") from err
            logger.debug("saved checkpoint %s (dropped %s)", self.directory / name, stale or "none")
        else:
            # One walk of the state both checks it and takes its tensors out.
            slots = staging.TensorSlots()
            skeleton = _plain(self._state_dicts(position), slots.take)
            # The previous write must be done before the staging buffer is reused.
            self._writer.wait()
            buffer, specs = self._stage.stage(slots.tensors)
            self._writer.submit(WriteRequest(buffer, specs, skeleton, name, position), str(self.directory / name))
        self._last_saved = position.global_step
        return self.directory / name

    def wait(self) -> None:
        """Wait until the in-flight background write (if any) is durable; raise CheckpointError if it failed."""
        if self._writer is not None:
            self._writer.wait()

    def close(self) -> None:
        """Wait for the in-flight write and stop the writer process; errors as :meth:`wait`."""
        if self._writer is not None:
            self._writer.close()
        if self._stage is not None:
            self._stage.close()

    def resume(self, *, allow_world_size_change: bool = False) -> ResumePoint:
        """Restore this saver's objects from the newest valid checkpoint of its directory, as
        :func:`recovery.ckpt.restore.resume` does, over every prefix but only this saver's lineage."""
        point = resume(
            self.directory, self.model, self.optimizer, self.lr_scheduler,
            sampler=self.sampler, rng=self.rng, allow_world_size_change=allow_world_size_change,
            lineage=self.lineage,
        )
        if point.path is not None:
            self._last_saved = point.global_step
        return point

    # -- as a callback ---------------------------------------------------------------------

    def on_train_step_end(self, position: TrainPosition) -> None:
        self.step_end(*position)

    def on_train_epoch_end(self, position: TrainPosition) -> None:
        self.epoch_end(*position)

    def on_train_end(self, position: TrainPosition) -> None:
        self.train_end(*position)

    # -- internals ---------------------------------------------------------------------------

    def state(self, position: TrainPosition) -> dict[str, Any]:
        """Everything a checkpoint of ``position`` holds, as the file would hold it.

        The model's and optimizer's own tensors are referenced, not copied.
        """
        return _plain(self._state_dicts(position))

    def _state_dicts(self, position: TrainPosition) -> dict[str, Any]:
        """:meth:`state` as the objects' ``state_dict`` methods give it, not yet checked."""
        data = None
        if self.sampler is not None:
            data = {**self.sampler.state_dict(), "epoch": position.epoch,
                    "step_in_epoch": position.step_in_epoch}
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "model": self.model.state_dict(),
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
            "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.state_dict(),
            "rng": None if self.rng is None else self.rng.state_dict(),
            "position": position.as_dict(),
            "data": data,
            "append_info": self.config.append_values(position),
            "rank": self.rank,
            "world_size": self.world_size,
            "lineage": self.lineage,
        }
