"""A writer killed mid-save leaves the previous checkpoint valid and chosen; exit waits for a write;
an async saver's writer process dies with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import torch

from recovery.ckpt import layout
from recovery.ckpt.checkpoint import CheckpointSaver
from recovery.ckpt.manifest import newest_valid, verify_dir
from recovery.ckpt.restore import resume
from support import BIN, REPO, wait_for


def writer(directory: Path, mode: str, megabytes: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(BIN / "ckpt_writer.py"), str(directory), mode, str(megabytes)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_kill_9_mid_save_leaves_the_previous_checkpoint_valid_and_chosen(tmp_path: Path) -> None:
    proc = writer(tmp_path, "sync", 384)
    # A temporary name has a random part (layout.temp_path): found by its owner's pid.
    pattern = f".net-1_2.ckpt.*.{proc.pid}.tmp"
    try:
        wait_for(lambda: any(tmp_path.glob(pattern)) or proc.poll() is not None, 60,
                 "the big checkpoint's temporary file")
        proc.send_signal(signal.SIGSTOP)
        # Caught mid-write: the temporary file is there and the final name is not.
        [temp] = tmp_path.glob(pattern)
        assert not (tmp_path / "net-1_2.ckpt").exists()
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL

    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["net-1_1.ckpt"]
    assert [(c.path.name, reason) for c, reason in verify_dir(tmp_path)] == [("net-1_1.ckpt", None)]
    found = newest_valid(tmp_path)
    assert found is not None and found[0].path == tmp_path / "net-1_1.ckpt"
    assert resume(tmp_path, torch.nn.Linear(4, 2)).global_step == 1
    # The next saver in the directory clears what the dead writer left.
    CheckpointSaver(torch.nn.Linear(4, 2), directory=tmp_path)
    assert not temp.exists()


def test_process_exit_waits_for_an_in_flight_background_write(tmp_path: Path) -> None:
    proc = writer(tmp_path, "async", 128)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "save requested" in out
    results = {c.path.name: reason for c, reason in verify_dir(tmp_path)}
    assert results == {"net-1_1.ckpt": None, "net-1_2.ckpt": None}
    assert not [name for name in os.listdir(tmp_path) if layout.temp_owner_pid(name) is not None]


def test_kill_9_of_an_async_saver_mid_write_takes_its_writer_process_along(tmp_path: Path) -> None:
    proc = writer(tmp_path, "async", 384)
    try:
        wait_for(lambda: any(tmp_path.glob(".net-1_2.ckpt.*.tmp")) or proc.poll() is not None, 60,
                 "the writer process's temporary file of the big checkpoint")
        [temp] = tmp_path.glob(".net-1_2.ckpt.*.tmp")
        writer_pid = layout.temp_owner_pid(temp.name)
        assert writer_pid is not None and writer_pid != proc.pid
        writer_process = psutil.Process(writer_pid)
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    writer_process.wait(30)  # PR_SET_PDEATHSIG: it does not outlive the training process

    assert [(c.path.name, reason) for c, reason in verify_dir(tmp_path)] == [("net-1_1.ckpt", None)]
    CheckpointSaver(torch.nn.Linear(4, 2), directory=tmp_path)
    assert not list(tmp_path.glob(".*.tmp"))
