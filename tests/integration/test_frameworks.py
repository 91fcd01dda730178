"""PyTorch Lightning and Hugging Face Trainer jobs under tftrun with the last-words
callbacks (recovery.lightning, recovery.hf; docs/frameworks.md): rank 1 is killed with
``kill -9`` (or rank 0 is sent SIGTERM) between two of the job's own checkpoints (every 10
steps), a survivor writes the framework's own checkpoint of its last completed step, and
the group restart resumes there. Skipped unless the packages are installed (``pip install -e .[frameworks]``, which
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

from support import BIN, events, log_has, spawn, spawned_pids, tftrun_cmd, wait_for

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


def _job(tmp_path: Path, name: str, script: str, way: str = "--last-words",
         *options: str) -> tuple[subprocess.Popen[str], Path, Path]:
    home = tmp_path / name
    out, logs = home / "out", home / "logs"
    proc = spawn(tftrun_cmd("--nproc_per_node=2", "--master_port=0", f"--log_dir={logs}",
                            f"--recovery_path={home / 'recovery'}",  # the jobs run side by side
                            *options, str(BIN / script), str(out), str(STEPS), way), cwd=tmp_path)
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


def _faults_against_a_clean_run(tmp_path: Path, script: str, saved: str, preloaded: str,
                                restart_killing: int | None = None) -> None:
    """Runs side by side: a fault-free one; one whose rank 1 is killed (``kill -9``)
    once it passed step 15 (after the job's own checkpoint ``saved`` of step 10), so rank 0
    learns of the death from its collective or tftrun's SIGTERM, whichever comes first; and
    one whose rank 0 is sent SIGTERM there (a preemption), which it must act on at a step
    boundary. Each faulty run must resume at the step of the fault, end 0, and end where
    the fault-free run ends. Each fork server imported the framework (``preloaded``, the
    start of its import's spec) before it forked the workers. With ``restart_killing``, a
    fourth: the script's in-process restart, that rank killed there
    (:func:`_check_in_process_restart`)."""
    clean, clean_out, clean_logs = _job(tmp_path, "clean", script)
    faults = {"kill": (signal.SIGKILL, 1), "term": (signal.SIGTERM, 0)}
    jobs = {name: _job(tmp_path, name, script) for name in faults}
    if restart_killing is not None:
        faults["in_process"] = (signal.SIGKILL, restart_killing)
        jobs["in_process"] = _job(tmp_path, "in_process", script, "--restartable")
    pending = dict(faults)

    def inject_when_due() -> bool:
        for name, (signum, rank) in list(pending.items()):
            _, out, logs = jobs[name]
            if (out / saved).exists() and log_has(logs, rank, f"step={KILL_AFTER}\n"):
                os.kill(spawned_pids(logs)[rank], signum)
                del pending[name]
        return not pending

    try:
        wait_for(inject_when_due, 300, f"{saved} written and the rank to stop past step {KILL_AFTER}")
    finally:
        ended = [_end(proc, 300) for proc in (*(job[0] for job in jobs.values()), clean)]
    assert [status for status, _ in ended] == [0] * len(ended), ended
    for _, _, logs in (*jobs.values(), (clean, clean_out, clean_logs)):
        assert f"preloaded {preloaded}" in (logs / "fork_server.log").read_text()

    (reference,) = _launches(clean_logs, 0)
    assert reference.loss is not None
    if restart_killing is not None:
        _, out, logs = jobs.pop("in_process")
        _check_in_process_restart(out, logs, clean_out, reference, restart_killing)
        del faults["in_process"]
    for name, (_, signalled) in faults.items():
        _, out, logs = jobs[name]
        first = [_launches(logs, rank)[0] for rank in (0, 1)]
        done_before = max(s for launch in first for s in launch.steps)
        assert KILL_AFTER <= done_before < 2 * SAVE_EVERY, (name, done_before)
        writer = first[1 - signalled] if name == "kill" else first[signalled]
        words = re.search(rf"last words at step {done_before} written .* \((.*)\)$", writer.text, re.MULTILINE)
        assert words, (name, writer.text[-2000:])
        if name == "term":
            assert words[1] == "SIGTERM", words[0]
        for rank in (0, 1):
            launches = _launches(logs, rank)
            assert [launch.start for launch in launches] == [0, done_before], (name, rank, done_before)
            final = launches[-1]
            assert final.steps[-1] == STEPS and final.loss is not None
            assert _rel(final.loss, reference.loss) <= TOLERANCE, (name, final.loss, reference.loss)
            assert _params_rel(out, clean_out, rank) <= TOLERANCE, name


def _check_in_process_restart(out: Path, logs: Path, clean_out: Path, reference: Launch, killed: int) -> None:
    """``killed`` was killed past step 15: the other rank kept its process and called the
    training again (Lightning's ``fit``, the script's decorated ``main``) at the step of its
    last words; ``killed`` was relaunched alone and resumed there with it (rank 0 hosts the
    next generation's store: it must not read before the survivor wrote); both end where
    the fault-free run ends."""
    survivor, = _launches(logs, 1 - killed)
    first, relaunched = _launches(logs, killed)
    starts = [int(s) for s in re.findall(r"^start step=(\d+)", survivor.text, re.MULTILINE)]
    assert len(starts) == 2 and starts[0] == 0, survivor.text[-2000:]
    resumed = starts[1]
    assert max(first.steps) <= resumed < 2 * SAVE_EVERY and KILL_AFTER <= resumed, (first.steps, resumed)
    assert f"last words at step {resumed} written" in survivor.text
    assert relaunched.start == resumed
    spawns = [e["rank"] for e in events(logs, "spawn") if e["role"] == "worker"]
    assert (spawns.count(1 - killed), spawns.count(killed)) == (1, 2), spawns
    for rank, final in ((1 - killed, survivor), (killed, relaunched)):
        assert final.steps[-1] == STEPS and final.loss is not None
        assert _rel(final.loss, reference.loss) <= TOLERANCE, (rank, final.loss, reference.loss)
        assert _params_rel(out, clean_out, rank) <= TOLERANCE, rank


def test_lightning_resumes_at_the_step_of_the_death(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    _faults_against_a_clean_run(tmp_path, "lightning_tiny.py", "last.ckpt", "lightning", restart_killing=1)


def test_hugging_face_trainer_resumes_at_the_step_of_the_death(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    _faults_against_a_clean_run(tmp_path, "hf_tiny.py", f"checkpoint-{SAVE_EVERY}", "transformers:",
                                restart_killing=0)
