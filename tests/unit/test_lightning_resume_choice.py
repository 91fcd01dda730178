"""``RestartableDDP`` (recovery/lightning.py): which checkpoint a restarted ``fit``
resumes from (the survivors' last words, unless the script's own checkpoint is newer;
every rank decides alike from the same files), and Lightning's DDP without tftrun."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Lightning is imported by the tests that run, not at collection: each pytest-xdist worker
# collects every module, and its import costs seconds of CPU.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                reason="lightning is not installed")


@pytest.fixture
def newer() -> Callable[..., Any]:
    from recovery.lightning import _newer

    return _newer


def _file(path: Path, mtime: float) -> Path:
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))
    return path


def test_the_last_words_win_over_an_older_checkpoint_of_the_script(
        tmp_path: Path, newer: Callable[..., Any]) -> None:
    words = _file(tmp_path / "last_words.ckpt", 200.0)
    own = _file(tmp_path / "own.ckpt", 100.0)
    assert newer(words, str(own)) == str(words)
    assert newer(words, None) == str(words)
    assert newer(words, "last") == str(words)  # Lightning's names for its own: not files


def test_a_newer_checkpoint_of_the_script_wins_over_last_words_of_an_earlier_fault(
        tmp_path: Path, newer: Callable[..., Any]) -> None:
    words = _file(tmp_path / "last_words.ckpt", 100.0)
    own = _file(tmp_path / "own.ckpt", 200.0)
    assert newer(words, str(own)) == str(own)
    assert newer(words, own) == own


def test_without_last_words_the_scripts_choice_stands(
        tmp_path: Path, newer: Callable[..., Any]) -> None:
    assert newer(tmp_path / "absent.ckpt", "last") == "last"
    assert newer(tmp_path / "absent.ckpt", None) is None


def test_without_tftrun_restartable_ddp_is_lightnings_ddp(
        alone: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``MS_SCHED_PORT`` (torchrun, a single process): ``fit`` runs once, through
    Lightning's own launcher, in the group already formed, and adds no callback."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from recovery.lightning import LastWordsCheckpoint, RestartableDDP

    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k != "MS_SCHED_PORT"})

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(strategy=RestartableDDP(), accelerator="cpu", devices=1, max_steps=3,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    trainer.fit(Tiny(), DataLoader(data, batch_size=2))
    assert trainer.global_step == 3
    assert not any(isinstance(c, LastWordsCheckpoint) for c in trainer.callbacks)
