"""Which checkpoint a restarted ``fit`` resumes from under ``RestartableDDP``
(recovery/lightning.py): the survivors' last words, unless the script's own checkpoint
is newer; every rank decides alike from the same files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from recovery.lightning import _newer  # noqa: E402


def _file(path: Path, mtime: float) -> Path:
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))
    return path


def test_the_last_words_win_over_an_older_checkpoint_of_the_script(tmp_path: Path) -> None:
    words = _file(tmp_path / "last_words.ckpt", 200.0)
    own = _file(tmp_path / "own.ckpt", 100.0)
    assert _newer(words, str(own)) == str(words)
    assert _newer(words, None) == str(words)
    assert _newer(words, "last") == str(words)  # Lightning's names for its own: not files


def test_a_newer_checkpoint_of_the_script_wins_over_last_words_of_an_earlier_fault(
        tmp_path: Path) -> None:
    words = _file(tmp_path / "last_words.ckpt", 100.0)
    own = _file(tmp_path / "own.ckpt", 200.0)
    assert _newer(words, str(own)) == str(own)
    assert _newer(words, own) == own


def test_without_last_words_the_scripts_choice_stands(tmp_path: Path) -> None:
    assert _newer(tmp_path / "absent.ckpt", "last") == "last"
    assert _newer(tmp_path / "absent.ckpt", None) is None
