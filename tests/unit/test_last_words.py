"""The last-words checkpoint: every rank's file of one step, complete or not there at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import recovery.ckpt.last_words as last_words
from recovery.ckpt import layout
from recovery.ckpt.checkpoint import CheckpointSaver
from recovery.ckpt.manifest import candidates, problem
from recovery.ckpt.restore import load_checkpoint
from recovery.position import TrainPosition

POSITION = TrainPosition(epoch=2, step_in_epoch=7, global_step=57)


def _saver(tmp_path: Path) -> CheckpointSaver:
    model = torch.nn.Linear(4, 2)
    return CheckpointSaver(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           directory=tmp_path / "periodic")


def test_every_rank_gets_a_verifiable_file_in_the_seeds_layout(tmp_path: Path) -> None:
    saver = _saver(tmp_path)
    step_dir = last_words.save_last_words(saver, tmp_path, POSITION, world_size=3)
    assert step_dir == tmp_path / "ttp_checkpoints" / "tft_saved_checkpoints-step_57"
    for rank in range(3):
        path = layout.ttp_checkpoint_path(tmp_path, rank, POSITION)
        assert path.name == f"ttp_rank_{rank}-2_7.ckpt"
        [candidate] = candidates(path.parent)
        assert candidate.path == path and problem(candidate) is None
        state = load_checkpoint(path)
        assert state["rank"] == rank and state["position"]["global_step"] == 57
        assert torch.equal(state["model"]["weight"], saver.model.weight)
    assert sorted(p.parent.name for p in map(Path, layout.ttp_rank_dirs(tmp_path, 1))) == [step_dir.name]


def test_a_save_cut_short_leaves_nothing_that_looks_like_a_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = last_words.write_checkpoint
    written: list[str] = []

    def fail_on_the_third(directory: Path, name: str, *args: object, **kwargs: object) -> list[str]:
        if len(written) == 2:
            raise OSError("disk full")
        written.append(name)
        return real_write(directory, name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(last_words, "write_checkpoint", fail_on_the_third)
    with pytest.raises(OSError, match="disk full"):
        last_words.save_last_words(_saver(tmp_path), tmp_path, POSITION, world_size=3)
    assert os.listdir(tmp_path / "ttp_checkpoints") == []
    assert layout.ttp_rank_dirs(tmp_path, 0) == []


def test_a_temporary_directory_of_a_dead_saver_is_removed_and_never_chosen(tmp_path: Path) -> None:
    dead = tmp_path / "ttp_checkpoints" / ".tft_saved_checkpoints-step_9.999999999.tmp" / "rank_0"
    dead.mkdir(parents=True)
    assert layout.ttp_rank_dirs(tmp_path, 0) == []
    last_words.save_last_words(_saver(tmp_path), tmp_path, POSITION, world_size=1)
    assert os.listdir(tmp_path / "ttp_checkpoints") == ["tft_saved_checkpoints-step_57"]
