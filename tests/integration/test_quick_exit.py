"""``recovery.quick_exit.exit_now``: the status, the flushed output, nothing else run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def test_exit_now_ends_with_its_status_and_output_flushed_and_runs_no_atexit_handler(
        tmp_path: Path) -> None:
    ran = tmp_path / "atexit_ran"
    script = textwrap.dedent(f"""
        import atexit, logging, sys
        from recovery.quick_exit import exit_now
        atexit.register(lambda: open({str(ran)!r}, "w").close())
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        logging.getLogger("t").info("logged")
        print("printed, still buffered")  # stdout is a pipe: block-buffered
        sys.stderr.write("written, unflushed")
        exit_now(3)
        print("after")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 3
    assert done.stdout == "printed, still buffered\n"
    assert done.stderr == "logged\nwritten, unflushed"
    assert not ran.exists()
