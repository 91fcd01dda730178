"""``tftctl new`` copies the shipped templates and never overwrites anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.cli import tftctl as ctl
from launcher.cli.new import available_templates
from support import REPO


def test_copies_a_template_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "job"
    assert ctl.main(["new", "mnist", str(dest)]) == 0
    source = REPO / "templates" / "mnist"
    expected = {p.name for p in source.glob("*.py") if p.name != "__init__.py"}
    assert {p.name for p in dest.iterdir()} >= expected
    assert (dest / "train.py").read_text() == (source / "train.py").read_text()
    assert not (dest / "__init__.py").exists()
    assert str(dest / "train.py") in capsys.readouterr().out


def test_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job").mkdir()
    assert ctl.main(["new", "mnist", str(tmp_path / "job")]) == 2
    assert "already exists" in capsys.readouterr().err
    assert list((tmp_path / "job").iterdir()) == []


def test_unknown_template_names_the_available_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["new", "no-such-template"]) == 2
    err = capsys.readouterr().err
    assert "no template named 'no-such-template'" in err
    assert "mnist" in available_templates() and "mnist" in err
