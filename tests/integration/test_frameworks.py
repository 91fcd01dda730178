"""PyTorch Lightning and Hugging Face Trainer jobs under tftrun, killed and resumed from
their own checkpoints (docs/frameworks.md). Skipped unless the packages are installed
(``pip install -e .[frameworks]``); CI does not install them."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from support import BIN, events, log_has, spawn, spawned_pids, tftrun_cmd, wait_for

pytestmark = pytest.mark.timeout(400)

STEPS = 40


def _kill_and_resume(tmp_path: Path, script: str, saved: str) -> list[dict[str, object]]:
    """Run ``script`` on 2 workers; once its checkpoint ``saved`` exists and rank 1 has
    stepped past it, kill -9 rank 1; the job must restart, resume past step 0 and end 0.
    Returns the job's ``exit`` events."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    proc = spawn(tftrun_cmd("--nproc_per_node=2", "--master_port=0", f"--log_dir={logs}",
                            str(BIN / script), str(out), str(STEPS)), cwd=tmp_path)
    try:
        wait_for(lambda: (out / saved).exists() and log_has(logs, 1, "step=12"), 300,
                 f"{saved} written and rank 1 at step 12")
        os.kill(spawned_pids(logs)[1], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, stdout + stderr
    for rank in (0, 1):
        text = (logs / f"worker_{rank}.log").read_text()
        starts = [int(k) for k in re.findall(r"^start step=(\d+)", text, re.MULTILINE)]
        assert len(starts) == 2 and starts[0] == 0 and starts[1] >= 5, (rank, starts)
        assert f"done step={STEPS}" in text
    return events(logs, "exit")


def test_lightning_ddp_resumes_from_its_last_checkpoint_after_a_kill(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    exits = _kill_and_resume(tmp_path, "lightning_tiny.py", "last.ckpt")
    # Lightning catches the group restart's SIGTERM; the stop still ends (SIGKILL at worst).
    assert any(e["rank"] == 0 and e["expected"] for e in exits)


def test_hugging_face_trainer_resumes_from_its_checkpoint_after_a_kill(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    _kill_and_resume(tmp_path, "hf_tiny.py", "checkpoint-5")
