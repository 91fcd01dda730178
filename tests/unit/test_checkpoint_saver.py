"""CheckpointSaver and resume in one process: keep_max, `_n`, what a checkpoint refuses to
hold (the background writer process: tests/integration/test_checkpoint_writer_process.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from recovery import env as envnames
from recovery.ckpt import layout
from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver
from recovery.ckpt.manifest import CheckpointError
from recovery.ckpt.restore import ResumePoint, WorldSizeMismatchError, load_checkpoint, resume
from recovery.position import TrainPosition
from support.checkpoints import TinyJob, assert_same_state, ckpt_names


def manifest_names(directory: Path) -> list[str]:
    return sorted(e["name"] for e in json.loads((directory / "manifest.json").read_text())["entries"])


def test_keep_max_keeps_the_newest_and_saves_on_schedule(tmp_path: Path) -> None:
    job = TinyJob()
    saver = job.saver(tmp_path, save_checkpoint_steps=2, keep_checkpoint_max=2)
    saved = [saver.step_end(epoch=1, step_in_epoch=g, global_step=g) for g in range(1, 11)]
    assert [p.name if p else None for p in saved[:4]] == [None, "net-1_2.ckpt", None, "net-1_4.ckpt"]
    assert ckpt_names(tmp_path) == manifest_names(tmp_path) == ["net-1_10.ckpt", "net-1_8.ckpt"]


def test_saving_the_same_step_again_replaces_it(tmp_path: Path) -> None:
    job = TinyJob()
    saver = job.saver(tmp_path, keep_checkpoint_max=1)
    saver.save(TrainPosition(1, 3, 3))
    job.step()
    saver.save(TrainPosition(1, 3, 3))
    assert ckpt_names(tmp_path) == manifest_names(tmp_path) == ["net-1_3.ckpt"]
    assert_same_state(load_checkpoint(tmp_path / "net-1_3.ckpt")["model"], job.model.state_dict())


def test_the_last_step_is_saved_when_training_ends_and_only_once(tmp_path: Path) -> None:
    job = TinyJob()
    saver = job.saver(tmp_path, save_checkpoint_steps=4)
    for g in range(1, 7):
        saver.step_end(epoch=1, step_in_epoch=g, global_step=g)
    assert saver.train_end(epoch=1, step_in_epoch=6, global_step=6) == tmp_path / "net-1_6.ckpt"
    again = job.saver(tmp_path, save_checkpoint_steps=4)
    again.step_end(epoch=1, step_in_epoch=8, global_step=8)
    assert again.train_end(epoch=1, step_in_epoch=8, global_step=8) is None
    assert ckpt_names(tmp_path) == ["net-1_4.ckpt", "net-1_6.ckpt", "net_1-1_8.ckpt"]


def test_a_second_run_writes_a_new_prefix_and_never_prunes_another_jobs(tmp_path: Path) -> None:
    job = TinyJob()
    first = job.saver(tmp_path, keep_checkpoint_max=1)
    first.save(TrainPosition(1, 5, 5))
    second = CheckpointSaver(job.model, config=CheckpointConfig(keep_checkpoint_max=1), prefix="net",
                             directory=tmp_path, lineage="another-job")
    assert second.prefix == "net_1"
    second.save(TrainPosition(1, 6, 6))
    second.save(TrainPosition(1, 7, 7))
    assert ckpt_names(tmp_path) == ["net-1_5.ckpt", "net_1-1_7.ckpt"]
    third = job.saver(tmp_path, keep_checkpoint_max=2)
    assert third.prefix == "net_2"
    third.save(TrainPosition(1, 4, 4))
    # A resume considers every prefix of its job: the highest (epoch, step) wins.
    assert resume(tmp_path, TinyJob().model).path == tmp_path / "net-1_5.ckpt"


def test_epoch_interval_and_callback_hooks(tmp_path: Path) -> None:
    job = TinyJob()
    saver = job.saver(tmp_path, save_checkpoint_steps=0, save_checkpoint_epochs=2)
    for epoch in (1, 2, 3):
        saver.on_train_step_end(TrainPosition(epoch, 5, epoch * 5))
        saver.on_train_epoch_end(TrainPosition(epoch, 5, epoch * 5))
    saver.on_train_end(TrainPosition(3, 5, 15))
    assert ckpt_names(tmp_path) == ["net-2_5.ckpt", "net-3_5.ckpt"]


def test_resume_without_a_checkpoint_starts_from_the_beginning(tmp_path: Path) -> None:
    job = TinyJob()
    before = {k: v.clone() for k, v in job.model.state_dict().items()}
    assert resume(tmp_path, job.model, job.optimizer) == ResumePoint()
    assert_same_state(job.model.state_dict(), before)


def test_default_directory_is_per_rank_under_the_recovery_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envnames.MS_RECOVERY_PATH, str(tmp_path))
    monkeypatch.setenv(envnames.RANK, "3")
    monkeypatch.setenv(envnames.WORLD_SIZE, "4")
    saver = CheckpointSaver(TinyJob().model)
    assert saver.directory == tmp_path / "checkpoints" / "rank_3"
    assert load_checkpoint(saver.save(TrainPosition(1, 1, 1)))["world_size"] == 4


def test_resuming_with_another_world_size_is_refused_unless_allowed(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envnames.WORLD_SIZE, "4")
    TinyJob().saver(tmp_path).save(TrainPosition(1, 2, 2))
    monkeypatch.setenv(envnames.WORLD_SIZE, "2")
    job = TinyJob(seed=5)
    with pytest.raises(WorldSizeMismatchError,
                       match="world size 4, this job has world size 2.*allow_world_size_change"):
        resume(tmp_path, job.model)
    assert resume(tmp_path, job.model, allow_world_size_change=True).global_step == 2


def test_restoring_an_optimizer_the_checkpoint_does_not_hold_is_an_error(tmp_path: Path) -> None:
    job = TinyJob()
    CheckpointSaver(job.model, directory=tmp_path).save(TrainPosition(1, 1, 1))
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        resume(tmp_path, job.model, job.optimizer)


class OpaqueScheduler:
    """A scheduler whose state holds an object weights_only loading would refuse."""

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": 3, "fn": OpaqueScheduler()}


def test_state_that_would_need_unpickling_is_refused_when_saving(tmp_path: Path) -> None:
    saver = CheckpointSaver(TinyJob().model, lr_scheduler=OpaqueScheduler(), directory=tmp_path)
    with pytest.raises(CheckpointError, match=r"checkpoint\['lr_scheduler'\]\['fn'\] has type OpaqueScheduler"):
        saver.save(TrainPosition(1, 1, 1))
    assert ckpt_names(tmp_path) == []


def test_a_failed_sync_write_raises(tmp_path: Path) -> None:
    saver = TinyJob().saver(tmp_path / "ckpt")
    shutil.rmtree(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="writing checkpoint .*net-1_1.ckpt failed"):
        saver.save(TrainPosition(1, 1, 1))


def test_a_pruned_file_is_written_over_by_the_next_save_and_a_dead_writers_spare_goes(
        tmp_path: Path) -> None:
    """Its pages are reused, not freed and allocated again; every checkpoint still verifies."""
    model = torch.nn.Linear(64, 64)
    saver = CheckpointSaver(model, config=CheckpointConfig(keep_checkpoint_max=2),
                            directory=tmp_path, prefix="net")
    paths = [saver.save(TrainPosition(1, g, g)) for g in (1, 2, 3)]
    spare = layout.spare_path(tmp_path)
    assert not paths[0].exists() and spare.exists()
    first_inode = spare.stat().st_ino
    with torch.no_grad():
        model.weight.add_(1.0)
    fourth = saver.save(TrainPosition(1, 4, 4))
    assert fourth.stat().st_ino == first_inode  # the pruned file, written over
    assert spare.exists() and sorted(p.name for p in tmp_path.glob("*.ckpt")) == [
        "net-1_3.ckpt", "net-1_4.ckpt"]
    assert torch.equal(load_checkpoint(fourth)["model"]["weight"], model.weight)
    assert load_checkpoint(paths[2])["position"]["global_step"] == 3
    dead = tmp_path / spare.name.replace(f".{os.getpid()}.", ".999999999.")
    spare.rename(dead)
    CheckpointSaver(model, directory=tmp_path, prefix="net")  # clears dead writers' files
    assert not dead.exists()
