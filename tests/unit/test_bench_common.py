"""The ``--json`` plumbing every bench shares (bench/common.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from support import REPO

sys.path.insert(0, str(REPO / "bench"))
from common import add_json_flag, emit, ratio  # noqa: E402 - bench/ is not a package


def test_json_flag_prints_one_strict_json_object(capsys) -> None:
    parser = argparse.ArgumentParser()
    add_json_flag(parser)
    args = parser.parse_args(["--json"])
    emit({"median_s": 1.5, "ratio": ratio(1.0, 0.0), "rounds": (1, 2), "dir": Path("/x")},
         args.json, ["not printed"])
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert json.loads(out) == {"median_s": 1.5, "ratio": None, "rounds": [1, 2], "dir": "/x"}


def test_without_the_flag_the_text_report_is_printed(capsys) -> None:
    parser = argparse.ArgumentParser()
    add_json_flag(parser)
    emit({"a": 1}, parser.parse_args([]).json, ["line one", "line two"])
    assert capsys.readouterr().out == "line one\nline two\n"
