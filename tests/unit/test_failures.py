"""Classifying how a process ended, phrased for the user."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from launcher.supervisor.failures import ExitInfo, read_error_file


def info(returncode: int) -> ExitInfo:
    return ExitInfo("worker", 2, 1234, 0, returncode, at=0.0)


def test_exit_code_is_kept_apart_from_signals() -> None:
    ended = info(3)
    assert ended.signal_name is None
    assert ended.exit_status == 3
    assert ended.fields()["exitcode"] == 3
    assert "signal" not in ended.fields()
    assert ended.describe() == "exited with code 3"


def test_signal_is_named_and_maps_to_128_plus_n() -> None:
    ended = info(-signal.SIGSEGV)
    assert ended.signal_name == "SIGSEGV"
    assert ended.exit_status == 128 + signal.SIGSEGV
    assert ended.fields()["signal"] == "SIGSEGV"
    assert "exitcode" not in ended.fields()


def test_sigkill_gets_the_out_of_memory_hint() -> None:
    assert "out of memory" in info(-signal.SIGKILL).describe()
    assert "out of memory" not in info(-signal.SIGTERM).describe()


def test_success() -> None:
    assert info(0).succeeded and not info(1).succeeded


def test_error_file_of_torch_record(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": {"message": "ZeroDivisionError: boom",
                                            "extraInfo": {}}}))
    assert read_error_file(path) == "ZeroDivisionError: boom"
    assert read_error_file(tmp_path / "missing.json") is None
    path.write_text("{torn")
    assert read_error_file(path) is None
