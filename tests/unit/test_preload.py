"""Which framework imports of a script the fork server makes before it forks
(launcher/procs/preload.py)."""

from __future__ import annotations

from pathlib import Path

from launcher.procs.preload import framework_imports

LIGHTNING = '''import os
import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from . import sibling


def main():
    import transformers
'''


def script(folder: Path, text: str) -> Path:
    path = folder / "train.py"
    path.write_text(text)
    return path


def test_the_frameworks_of_the_top_level_are_named_with_what_is_taken_from_them(tmp_path: Path) -> None:
    assert framework_imports(script(tmp_path, LIGHTNING)) == \
        "lightning;lightning.pytorch.callbacks:Callback,ModelCheckpoint"
    hf = "from transformers import Trainer, TrainingArguments\nimport accelerate, numpy\n"
    assert framework_imports(script(tmp_path, hf)) == "transformers:Trainer,TrainingArguments;accelerate"


def test_a_framework_shadowed_by_a_module_of_the_scripts_folder_is_left_to_the_worker(
        tmp_path: Path) -> None:
    (tmp_path / "lightning.py").write_text("")
    assert framework_imports(script(tmp_path, LIGHTNING)) == ""
    (tmp_path / "lightning.py").unlink()
    (tmp_path / "lightning").mkdir()
    assert framework_imports(script(tmp_path, LIGHTNING)) == ""


def test_a_script_that_cannot_be_read_or_parsed_names_none(tmp_path: Path) -> None:
    assert framework_imports(tmp_path / "missing.py") == ""
    assert framework_imports(script(tmp_path, "import lightning\ndef broken(:\n")) == ""
    (tmp_path / "binary.py").write_bytes(b"\xff\xfe\x00import lightning")
    assert framework_imports(tmp_path / "binary.py") == ""
