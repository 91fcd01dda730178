"""`tftctl ckpt ls|verify|show` on real checkpoint trees."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from launcher.cli import tftctl as ctl
from recovery.ckpt import layout
from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver
from recovery.position import TrainPosition


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A recovery path with two ranks of two checkpoints each."""
    for rank in (0, 1):
        saver = CheckpointSaver(
            torch.nn.Linear(3, 2), directory=layout.rank_dir(tmp_path, rank), prefix="mnist",
            config=CheckpointConfig(append_info=["step_num", {"lr": 0.01}]),
        )
        for step in (5, 10):
            saver.save(TrainPosition(1, step, step))
    return tmp_path


def test_ls_lists_every_rank_with_its_steps_and_validity(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (layout.rank_dir(tree, 1) / "mnist-1_10.ckpt").write_bytes(b"torn")
    assert ctl.main(["ckpt", "ls", str(tree)]) == 0
    out = capsys.readouterr().out
    assert all(column in out for column in ("rank", "epoch", "step", "size", "time", "valid"))
    rows = [line for line in out.splitlines() if ".ckpt" in line]
    assert len(rows) == 4
    torn = next(row for row in rows if "rank_1/mnist-1_10.ckpt" in row)
    assert "no: truncated" in torn and " 4 " in torn
    assert sum("yes" in row for row in rows) == 3


def test_verify_passes_a_clean_tree(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["ckpt", "verify", str(tree)]) == 0
    assert "ok: 4 checkpoint(s) valid" in capsys.readouterr().out


def test_verify_fails_naming_every_bad_file(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (layout.rank_dir(tree, 0) / "mnist-1_5.ckpt").unlink()
    (layout.rank_dir(tree, 1) / "stray-2_1.ckpt").write_bytes(b"x")
    assert ctl.main(["ckpt", "verify", str(tree)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert any("rank_0/mnist-1_5.ckpt: missing" in line for line in err)
    assert any("rank_1/stray-2_1.ckpt: not in the manifest" in line for line in err)


def test_show_prints_keys_shapes_and_append_info(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["ckpt", "show", str(layout.rank_dir(tree, 1) / "mnist-1_10.ckpt")]) == 0
    out = capsys.readouterr().out
    assert "keys: format, version, model, optimizer" in out
    assert "model.weight: tensor (2, 3) float32" in out
    assert "append_info.step_num: 10" in out and "append_info.lr: 0.01" in out
    assert "world_size: 1" in out


def test_show_refuses_an_invalid_file_in_one_line(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = layout.rank_dir(tree, 0) / "mnist-1_10.ckpt"
    path.write_bytes(path.read_bytes()[:-1] + b"!")
    assert ctl.main(["ckpt", "show", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "corrupt: xxh3_128 differs" in err


def test_a_directory_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    assert ctl.main(["ckpt", "ls", str(tmp_path / "nope")]) == 2
