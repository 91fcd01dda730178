"""Classifying how a process ended, phrased for the user."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config import LaunchConfig
from launcher.procs.spec import error_file, prepare_error_file
from launcher.supervisor.failures import ExitInfo, read_error_file
from launcher.view.render import SummaryRow, print_summary
from recovery import env as names


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


def test_error_file_written_by_record_gives_the_exception_and_its_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torch's own ``@record`` writes the file; the summary shows what torchrun's failure
    table shows: the exception's line, then its traceback, and not the log's lines."""
    path = tmp_path / "errors" / "worker_1.json"
    config = LaunchConfig(script=Path("train.py"), log_dir=tmp_path)
    path.parent.mkdir()
    path.write_text("{}")  # an earlier launch's file: gone before the next launch
    prepare_error_file(config, 1)
    assert not path.exists()
    assert error_file(config, 1) == path.resolve()
    program = ("from torch.distributed.elastic.multiprocessing.errors import record\n"
               "@record\ndef main():\n    raise ValueError('boom from rank 1')\nmain()\n")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            env={**os.environ, names.TORCHELASTIC_ERROR_FILE: str(path)})
    assert result.returncode == 1
    cause = read_error_file(path)
    assert cause is not None
    first, _, stack = cause.partition("\n")
    assert first == "ValueError: boom from rank 1"
    assert stack.startswith("Traceback (most recent call last):")
    assert stack.rstrip().endswith("ValueError: boom from rank 1")
    print_summary([SummaryRow(1, 42, "exited with code 1", 0)], "rank 1 (pid 42) exited with code 1",
                  ["a log line"], cause)
    out = capsys.readouterr().out
    assert "  error: ValueError: boom from rank 1" in out
    assert "traceback (from its error file):" in out
    assert "a log line" not in out
    print_summary([SummaryRow(1, 42, "exited with code 1", 0)], "rank 1 (pid 42) exited with code 1",
                  ["a log line"], None)
    assert "last lines of its log:\n    a log line" in capsys.readouterr().out
