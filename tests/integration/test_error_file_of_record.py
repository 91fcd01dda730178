"""The error file torch's ``@record`` writes in a real failing process, read back as the
end summary shows it: the exception's line and its traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config import LaunchConfig
from launcher.procs.spec import error_file, prepare_error_file
from launcher.supervisor.failures import read_error_file
from launcher.view.render import SummaryRow, print_summary
from recovery import env as names


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
