"""PyTorch Lightning and Hugging Face Trainer jobs under tftrun with the last-words
callbacks (recovery.lightning, recovery.hf; docs/frameworks.md): rank 1 is killed with
``kill -9`` between two of the job's own checkpoints (every 10 steps), the survivor writes
the framework's own checkpoint of its last completed step, and the group restart resumes
there. Skipped unless the packages are installed (``pip install -e .[frameworks]``, which
.ci/run does)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from support import BIN, log_has, spawn, spawned_pids, tftrun_cmd, wait_for

pytestmark = pytest.mark.timeout(400)

STEPS = 30
SAVE_EVERY = 10
"""The jobs' own checkpoint interval (tests/bin/lightning_tiny.py, hf_tiny.py)."""
KILL_AFTER = 15
"""Rank 1 is killed once it reported this step: between the checkpoints of steps 10 and 20."""
TOLERANCE = 1e-4

_HEADER = re.compile(r"^==== tftrun: worker rank=\d+ .*====$", re.MULTILINE)


@dataclass
class Launch:
    """What one launch of a worker printed (tests/bin/*_tiny.py)."""

    start: int | None
    steps: list[int]
    loss: float | None
    text: str


def _launches(logs: Path, rank: int) -> list[Launch]:
    """The launches of ``rank``, in order, from ``worker_<rank>.log``."""
    parts = _HEADER.split((logs / f"worker_{rank}.log").read_text(errors="ignore"))[1:]
    launches = []
    for text in parts:
        start = re.search(r"^start step=(\d+)", text, re.MULTILINE)
        done = re.search(r"^done step=\d+ loss=(\S+)", text, re.MULTILINE)
        launches.append(Launch(
            start=int(start[1]) if start else None,
            steps=[int(s) for s in re.findall(r"^step=(\d+)", text, re.MULTILINE)],
            loss=float(done[1]) if done else None,
            text=text))
    return launches


def _job(tmp_path: Path, name: str, script: str) -> tuple[subprocess.Popen[str], Path, Path]:
    home = tmp_path / name
    out, logs = home / "out", home / "logs"
    proc = spawn(tftrun_cmd("--nproc_per_node=2", "--master_port=0", f"--log_dir={logs}",
                            f"--recovery_path={home / 'recovery'}",  # two jobs run side by side
                            str(BIN / script), str(out), str(STEPS), "--last-words"), cwd=tmp_path)
    return proc, out, logs


def _end(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, stdout + stderr


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _params_rel(out: Path, reference: Path, rank: int) -> float:
    """The relative distance of the final parameters of two runs: |a - b| / |b|."""
    name = f"final_params_{rank}.pt"
    a, b = torch.load(out / name), torch.load(reference / name)
    assert a.shape == b.shape
    return float((a - b).norm() / b.norm())


def _kill_between_checkpoints(tmp_path: Path, script: str, saved: str) -> None:
    """A fault-free run and a run whose rank 1 is killed at step ~15 (after its checkpoint
    ``saved`` of step 10), side by side; the killed run must resume at the step of the
    death, end 0, and end where the fault-free run ends."""
    clean, clean_out, clean_logs = _job(tmp_path, "clean", script)
    faulty, out, logs = _job(tmp_path, "faulty", script)
    try:
        wait_for(lambda: (out / saved).exists() and log_has(logs, 1, f"step={KILL_AFTER}\n"), 300,
                 f"{saved} written and rank 1 past step {KILL_AFTER}")
        os.kill(spawned_pids(logs)[1], signal.SIGKILL)
    finally:
        ended = [_end(proc, 300) for proc in (faulty, clean)]
    assert [status for status, _ in ended] == [0, 0], ended

    first = [_launches(logs, rank)[0] for rank in (0, 1)]
    done_before = max(s for launch in first for s in launch.steps)
    assert KILL_AFTER <= done_before < 2 * SAVE_EVERY, done_before
    assert re.search(rf"last words at step {done_before} written", first[0].text), first[0].text[-2000:]
    (reference,) = _launches(clean_logs, 0)
    assert reference.loss is not None
    for rank in (0, 1):
        launches = _launches(logs, rank)
        assert [launch.start for launch in launches] == [0, done_before], (rank, done_before)
        final = launches[-1]
        assert final.steps[-1] == STEPS and final.loss is not None
        assert _rel(final.loss, reference.loss) <= TOLERANCE, (final.loss, reference.loss)
        assert _params_rel(out, clean_out, rank) <= TOLERANCE


def test_lightning_resumes_at_the_step_of_the_death(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    _kill_between_checkpoints(tmp_path, "lightning_tiny.py", "last.ckpt")


def test_hugging_face_trainer_resumes_at_the_step_of_the_death(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    _kill_between_checkpoints(tmp_path, "hf_tiny.py", f"checkpoint-{SAVE_EVERY}")
