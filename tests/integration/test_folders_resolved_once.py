"""The log dir is resolved once, at the start (issue 38): a symbolic link on its way that
is pointed elsewhere during the job sends neither the relaunched workers' logs nor the
error files torch's ``@record`` writes into the folder it now points to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import BIN, spawn, terminate, tftrun_cmd, wait_for

pytestmark = pytest.mark.timeout(180)


def test_a_link_on_the_log_dirs_way_pointed_elsewhere_before_a_relaunch_redirects_nothing(
        tmp_path: Path) -> None:
    """Rank 1 raises in both launches (record_boom.py), each once the gate exists: the link
    is pointed at another folder between the start and the gate, so the second launch's
    logs and error file would land there if the path were resolved at each launch."""
    real, elsewhere, gate = tmp_path / "real", tmp_path / "elsewhere", tmp_path / "gate"
    (elsewhere / "logs").mkdir(parents=True)
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    proc = spawn(tftrun_cmd("--nproc_per_node=2", "--max_restarts=1", f"--log_dir={link / 'logs'}",
                            str(BIN / "gated.py"), str(gate), str(BIN / "record_boom.py"), "0,1"))
    try:
        wait_for(lambda: (real / "logs" / "worker_1.log").exists(), 60, "the first launch")
        link.unlink()
        link.symlink_to(elsewhere)
        gate.touch()
        output = "".join(proc.communicate(timeout=150))
    finally:
        terminate(proc)
    assert proc.returncode == 1, output
    assert list((elsewhere / "logs").iterdir()) == []
    assert "  error: ValueError: boom from rank 1" in output
    error = json.loads((real / "logs" / "errors" / "worker_1.json").read_text())
    assert error["message"]["message"] == "ValueError: boom from rank 1"
    assert (real / "logs" / "worker_1.log").read_text().count("boom from rank 1") >= 2
