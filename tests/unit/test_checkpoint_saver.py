"""CheckpointSaver and resume in one process: complete state, keep_max, `_n`, async errors."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch

from recovery import env as envnames
from recovery.ckpt import layout
from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver
from recovery.ckpt.manifest import CheckpointError
from recovery.ckpt.restore import ResumePoint, WorldSizeMismatchError, load_checkpoint, resume
from recovery.position import TrainPosition
from recovery.train.sampler import ResumableDistributedSampler


class Job:
    """A tiny model with a momentum optimizer, an LR scheduler and a sampler."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.5)
        self.sampler = ResumableDistributedSampler(40, 4, seed=7)

    def step(self) -> None:
        self.optimizer.zero_grad()
        self.model(torch.randn(4, 6)).pow(2).sum().backward()
        self.optimizer.step()
        self.scheduler.step()

    def saver(self, directory: Path, **config: Any) -> CheckpointSaver:
        saver = CheckpointSaver(
            self.model, self.optimizer, self.scheduler, config=CheckpointConfig(**config),
            prefix="net", directory=directory, sampler=self.sampler,
        )
        return saver


def ckpt_names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.ckpt"))


def manifest_names(directory: Path) -> list[str]:
    return sorted(e["name"] for e in json.loads((directory / "manifest.json").read_text())["entries"])


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def assert_same_state(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_state(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_state(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("async_save", [False, True])
def test_resume_restores_model_optimizer_scheduler_rng_and_data_position(tmp_path: Path, async_save: bool) -> None:
    job = Job()
    saver = job.saver(tmp_path, save_checkpoint_steps=100, append_info=["epoch_num", "step_num", {"note": "x"}],
                      async_save=async_save)
    for _ in range(5):
        job.step()
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    saver.save(TrainPosition(2, 3, 8))
    saver.close()
    expected_draws = draws()

    other = Job(seed=99)
    point = resume(tmp_path, other.model, other.optimizer, other.scheduler, sampler=other.sampler)
    assert (point.epoch, point.step_in_epoch, point.global_step) == (2, 3, 8)
    assert point.path == tmp_path / "net-2_3.ckpt"
    assert point.append_info == {"epoch_num": 2, "step_num": 8, "note": "x"}
    assert draws() == expected_draws
    assert_same_state(other.model.state_dict(), job.model.state_dict())
    assert_same_state(other.optimizer.state_dict(), job.optimizer.state_dict())
    assert other.scheduler.state_dict() == job.scheduler.state_dict()
    assert (other.sampler.epoch, other.sampler.init_step) == (2, 3)
    state = load_checkpoint(point.path)
    assert state["world_size"] == 1 and state["rank"] == 0
    # The cursor was never moved by this loop (it iterates by steps): recorded at step 0,
    # it is ignored on load, where the step places the sampler.
    assert state["data"] == {"seed": 7, "batch_size": 4, "cursor": 0, "cursor_step": 0,
                             "num_replicas": 1, "epoch": 2, "step": 3}


def test_async_save_writes_the_state_of_the_moment_it_was_called(tmp_path: Path) -> None:
    job = Job()
    saver = job.saver(tmp_path, async_save=True)
    before = {k: v.clone() for k, v in job.model.state_dict().items()}
    path = saver.save(TrainPosition(1, 1, 1))
    with torch.no_grad():
        for param in job.model.parameters():
            param.add_(1.0)  # training goes on while the writer writes
    saver.close()
    assert_same_state(load_checkpoint(path)["model"], before)


def test_keep_max_keeps_the_newest_and_saves_on_schedule(tmp_path: Path) -> None:
    job = Job()
    saver = job.saver(tmp_path, save_checkpoint_steps=2, keep_checkpoint_max=2)
    saved = [saver.step_end(epoch=1, step_in_epoch=g, global_step=g) for g in range(1, 11)]
    assert [p.name if p else None for p in saved[:4]] == [None, "net-1_2.ckpt", None, "net-1_4.ckpt"]
    assert ckpt_names(tmp_path) == manifest_names(tmp_path) == ["net-1_10.ckpt", "net-1_8.ckpt"]


def test_saving_the_same_step_again_replaces_it(tmp_path: Path) -> None:
    job = Job()
    saver = job.saver(tmp_path, keep_checkpoint_max=1)
    saver.save(TrainPosition(1, 3, 3))
    job.step()
    saver.save(TrainPosition(1, 3, 3))
    assert ckpt_names(tmp_path) == manifest_names(tmp_path) == ["net-1_3.ckpt"]
    assert_same_state(load_checkpoint(tmp_path / "net-1_3.ckpt")["model"], job.model.state_dict())


def test_consecutive_async_saves_each_hold_their_own_moment(tmp_path: Path) -> None:
    job = Job()
    saver = job.saver(tmp_path, async_save=True)
    moments = []
    for global_step in (1, 2, 3):
        job.step()
        moments.append({k: v.clone() for k, v in job.model.state_dict().items()})
        saver.save(TrainPosition(1, global_step, global_step))
    saver.close()
    for global_step, moment in zip((1, 2, 3), moments):
        assert_same_state(load_checkpoint(tmp_path / f"net-1_{global_step}.ckpt")["model"], moment)


def test_the_last_step_is_saved_when_training_ends_and_only_once(tmp_path: Path) -> None:
    job = Job()
    saver = job.saver(tmp_path, save_checkpoint_steps=4)
    for g in range(1, 7):
        saver.step_end(epoch=1, step_in_epoch=g, global_step=g)
    assert saver.train_end(epoch=1, step_in_epoch=6, global_step=6) == tmp_path / "net-1_6.ckpt"
    again = job.saver(tmp_path, save_checkpoint_steps=4)
    again.step_end(epoch=1, step_in_epoch=8, global_step=8)
    assert again.train_end(epoch=1, step_in_epoch=8, global_step=8) is None
    assert ckpt_names(tmp_path) == ["net-1_4.ckpt", "net-1_6.ckpt", "net_1-1_8.ckpt"]


def test_a_second_run_writes_a_new_prefix_and_never_prunes_another_jobs(tmp_path: Path) -> None:
    job = Job()
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
    assert resume(tmp_path, Job().model).path == tmp_path / "net-1_5.ckpt"


def test_epoch_interval_and_callback_hooks(tmp_path: Path) -> None:
    job = Job()
    saver = job.saver(tmp_path, save_checkpoint_steps=0, save_checkpoint_epochs=2)
    for epoch in (1, 2, 3):
        saver.on_train_step_end(TrainPosition(epoch, 5, epoch * 5))
        saver.on_train_epoch_end(TrainPosition(epoch, 5, epoch * 5))
    saver.on_train_end(TrainPosition(3, 5, 15))
    assert ckpt_names(tmp_path) == ["net-2_5.ckpt", "net-3_5.ckpt"]


def test_resume_without_a_checkpoint_starts_from_the_beginning(tmp_path: Path) -> None:
    job = Job()
    before = {k: v.clone() for k, v in job.model.state_dict().items()}
    assert resume(tmp_path, job.model, job.optimizer) == ResumePoint()
    assert_same_state(job.model.state_dict(), before)


def test_default_directory_is_per_rank_under_the_recovery_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envnames.MS_RECOVERY_PATH, str(tmp_path))
    monkeypatch.setenv(envnames.RANK, "3")
    monkeypatch.setenv(envnames.WORLD_SIZE, "4")
    saver = CheckpointSaver(Job().model)
    assert saver.directory == tmp_path / "checkpoints" / "rank_3"
    assert load_checkpoint(saver.save(TrainPosition(1, 1, 1)))["world_size"] == 4


def test_resuming_with_another_world_size_is_refused_unless_allowed(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envnames.WORLD_SIZE, "4")
    Job().saver(tmp_path).save(TrainPosition(1, 2, 2))
    monkeypatch.setenv(envnames.WORLD_SIZE, "2")
    job = Job(seed=5)
    with pytest.raises(WorldSizeMismatchError,
                       match="world size 4, this job has world size 2.*allow_world_size_change"):
        resume(tmp_path, job.model)
    assert resume(tmp_path, job.model, allow_world_size_change=True).global_step == 2


def test_restoring_an_optimizer_the_checkpoint_does_not_hold_is_an_error(tmp_path: Path) -> None:
    job = Job()
    CheckpointSaver(job.model, directory=tmp_path).save(TrainPosition(1, 1, 1))
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        resume(tmp_path, job.model, job.optimizer)


class OpaqueScheduler:
    """A scheduler whose state holds an object weights_only loading would refuse."""

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": 3, "fn": OpaqueScheduler()}


def test_state_that_would_need_unpickling_is_refused_when_saving(tmp_path: Path) -> None:
    saver = CheckpointSaver(Job().model, lr_scheduler=OpaqueScheduler(), directory=tmp_path)
    with pytest.raises(CheckpointError, match=r"checkpoint\['lr_scheduler'\]\['fn'\] has type OpaqueScheduler"):
        saver.save(TrainPosition(1, 1, 1))
    assert ckpt_names(tmp_path) == []


class StateOf:
    """An LR scheduler stand-in whose state is whatever the test gives it."""

    def __init__(self, state: dict[Any, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[Any, Any]:
        return self.state


@pytest.mark.parametrize("async_save", [False, True])
@pytest.mark.parametrize(("state", "where"), [
    ({"milestones": {frozenset([1]): 2}}, r"checkpoint\['lr_scheduler'\]\['milestones'\] key has type frozenset"),
    ({"phases": [1, (2, object())]}, r"checkpoint\['lr_scheduler'\]\['phases'\]\[1\]\[1\] has type object"),
])
def test_what_a_checkpoint_cannot_hold_is_named_by_its_place_in_the_state(
        tmp_path: Path, async_save: bool, state: dict[Any, Any], where: str) -> None:
    saver = CheckpointSaver(Job().model, lr_scheduler=StateOf(state), directory=tmp_path,
                            config=CheckpointConfig(async_save=async_save))
    try:
        with pytest.raises(CheckpointError, match=where):
            saver.save(TrainPosition(1, 1, 1))
        saver.lr_scheduler = StateOf({(1, "tuple key"): [torch.ones(2)], "last_epoch": 3})  # plain: saved
        saver.save(TrainPosition(1, 2, 2))
    finally:
        saver.close()
    assert load_checkpoint(tmp_path / "checkpoint-1_2.ckpt")["lr_scheduler"]["last_epoch"] == 3
    assert ckpt_names(tmp_path) == ["checkpoint-1_2.ckpt"]


def test_a_failed_sync_write_raises(tmp_path: Path) -> None:
    saver = Job().saver(tmp_path / "ckpt")
    shutil.rmtree(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="writing checkpoint .*net-1_1.ckpt failed"):
        saver.save(TrainPosition(1, 1, 1))


def test_a_failed_background_write_surfaces_in_the_training_thread(tmp_path: Path) -> None:
    saver = Job().saver(tmp_path / "ckpt", save_checkpoint_steps=1, async_save=True)
    shutil.rmtree(tmp_path / "ckpt")
    saver.step_end(1, 1, 1)  # only snapshots; the write fails on the writer thread
    with pytest.raises(CheckpointError, match="writing checkpoint .*net-1_1.ckpt failed") as caught:
        saver.wait()
    assert isinstance(caught.value.__cause__, FileNotFoundError)
    # Not swallowed when the loop never waits either: the next step raises it.
    saver.step_end(1, 2, 2)
    with pytest.raises(CheckpointError, match="net-1_2.ckpt failed"):
        saver.step_end(1, 3, 3)
    saver.close()


def test_a_failed_background_write_surfaces_at_a_step_that_saves_nothing(tmp_path: Path) -> None:
    saver = Job().saver(tmp_path / "ckpt", save_checkpoint_steps=1000, async_save=True)
    shutil.rmtree(tmp_path / "ckpt")
    saver.save(TrainPosition(1, 1, 1))
    deadline = time.monotonic() + 30
    with pytest.raises(CheckpointError, match="net-1_1.ckpt failed"):
        for step in itertools.count(2):  # steps that never save: only the writer's answer can raise
            saver.step_end(1, step, step)
            assert time.monotonic() < deadline, "the failed write never surfaced"
    saver.close()


def test_the_writer_process_keeps_none_of_the_training_processs_sockets(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        saver = Job().saver(tmp_path, async_save=True)
        saver.save(TrainPosition(1, 1, 1))
        saver.wait()  # the writer has answered: it is past its set-up
        [writer] = psutil.Process().children()
        ports = {conn.laddr.port for conn in writer.net_connections(kind="inet")}
        assert listener.getsockname()[1] not in ports and not ports
        assert writer.num_fds() <= 5  # stdin, stdout, stderr, its pipe, its map of the stage
        saver.close()
    assert not writer.is_running() or writer.status() == psutil.STATUS_ZOMBIE


def test_the_writer_process_runs_at_the_training_processs_priority_and_leaves_its_settings(tmp_path: Path) -> None:
    # At nice 10 the writer got no CPU while training kept every core busy, and the next
    # save waited for the whole write (docs/benchmarks.md, "Checkpoint overhead").
    saver = Job().saver(tmp_path, async_save=True)
    try:
        saver.save(TrainPosition(1, 1, 1))
        saver.wait()  # the writer has answered: it is past its set-up
        [writer] = psutil.Process().children()
        assert writer.nice() == psutil.Process().nice()
        assert torch.serialization.get_crc32_options()  # only the writer saves without the zip's CRC32
    finally:
        saver.close()
    assert load_checkpoint(tmp_path / "net-1_1.ckpt")["position"]["global_step"] == 1


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
