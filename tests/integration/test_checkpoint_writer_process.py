"""CheckpointSaver's background writer, a process forked from the training process:
what it writes is the state of the moment of the save, its failures surface in training,
and it keeps none of the training process's sockets or settings."""

from __future__ import annotations

import itertools
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

from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver
from recovery.ckpt.manifest import CheckpointError
from recovery.ckpt.restore import load_checkpoint, resume
from recovery.position import TrainPosition
from support.checkpoints import TinyJob, assert_same_state, ckpt_names


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


@pytest.mark.parametrize("async_save", [False, True])
def test_resume_restores_model_optimizer_scheduler_rng_and_data_position(tmp_path: Path, async_save: bool) -> None:
    job = TinyJob()
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

    other = TinyJob(seed=99)
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
                             "num_replicas": 1, "epoch": 2, "step_in_epoch": 3}


def test_async_save_writes_the_state_of_the_moment_it_was_called(tmp_path: Path) -> None:
    job = TinyJob()
    saver = job.saver(tmp_path, async_save=True)
    before = {k: v.clone() for k, v in job.model.state_dict().items()}
    path = saver.save(TrainPosition(1, 1, 1))
    with torch.no_grad():
        for param in job.model.parameters():
            param.add_(1.0)  # training goes on while the writer writes
    saver.close()
    assert_same_state(load_checkpoint(path)["model"], before)


def test_consecutive_async_saves_each_hold_their_own_moment(tmp_path: Path) -> None:
    job = TinyJob()
    saver = job.saver(tmp_path, async_save=True)
    moments = []
    for global_step in (1, 2, 3):
        job.step()
        moments.append({k: v.clone() for k, v in job.model.state_dict().items()})
        saver.save(TrainPosition(1, global_step, global_step))
    saver.close()
    for global_step, moment in zip((1, 2, 3), moments):
        assert_same_state(load_checkpoint(tmp_path / f"net-1_{global_step}.ckpt")["model"], moment)


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
    saver = CheckpointSaver(TinyJob().model, lr_scheduler=StateOf(state), directory=tmp_path,
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


def test_a_failed_background_write_surfaces_in_the_training_thread(tmp_path: Path) -> None:
    saver = TinyJob().saver(tmp_path / "ckpt", save_checkpoint_steps=1, async_save=True)
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
    saver = TinyJob().saver(tmp_path / "ckpt", save_checkpoint_steps=1000, async_save=True)
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
        saver = TinyJob().saver(tmp_path, async_save=True)
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
    saver = TinyJob().saver(tmp_path, async_save=True)
    try:
        saver.save(TrainPosition(1, 1, 1))
        saver.wait()  # the writer has answered: it is past its set-up
        [writer] = psutil.Process().children()
        assert writer.nice() == psutil.Process().nice()
        assert torch.serialization.get_crc32_options()  # only the writer saves without the zip's CRC32
    finally:
        saver.close()
    assert load_checkpoint(tmp_path / "net-1_1.ckpt")["position"]["global_step"] == 1
