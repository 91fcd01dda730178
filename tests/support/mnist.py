"""Test helpers for the MNIST template: tiny idx files, its data module by path, and the
main job under tftrun (command line, final digests)."""

from __future__ import annotations

import gzip
import importlib.util
import struct
import subprocess
from pathlib import Path
from types import ModuleType

import numpy as np

from support import REPO, events, tftrun_cmd

TEMPLATE = REPO / "templates" / "mnist"
TRAIN = TEMPLATE / "train.py"
HIDDEN = 64
"""The width of the template's hidden layers in the tests' jobs (the sample's is 512): what
they test does not depend on it, and a step of 3 ranks costs the suite's two cores about half
as much."""
NARROW = ("--hidden_size", str(HIDDEN))
JOB = (*NARROW, "--epochs", "1", "--max_steps", "80", "--save_steps", "20", "--synthetic_size", "12000",
       "--log_every", "5")
"""The main job as the fault tests run it: 80 steps of 3 ranks, a checkpoint every 20."""
WORKERS = 3


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> Path:
    """Write ``array`` (uint8) as an idx file; ``compress`` adds ``.gz`` to the name."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        raw = gzip.compress(raw)
    path.write_bytes(raw)
    return path


def write_mnist(directory: Path, samples: int, compress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A tiny MNIST directory; returns its images and labels."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (samples, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, samples, dtype=np.uint8)
    directory.mkdir(parents=True, exist_ok=True)
    write_idx(directory / "train-images-idx3-ubyte", images, compress)
    write_idx(directory / "train-labels-idx1-ubyte", labels, compress)
    return images, labels


def mnist_data() -> ModuleType:
    """templates/mnist/mnist_data.py, loaded by path as the script itself sees it."""
    spec = importlib.util.spec_from_file_location("mnist_data", TEMPLATE / "mnist_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mnist_job(tmp_path: Path, name: str, port: int, *options: str,
              job: tuple[str, ...] = JOB) -> list[str]:
    """tftrun running the main job on 3 ranks, logs in ``tmp_path/name``, no cooldown."""
    return tftrun_cmd(f"--worker_num={WORKERS}", f"--log_dir={tmp_path / name}",
                      f"--recovery_path={tmp_path / (name + '_recovery')}",
                      f"--master_port={port}", "--rejoin_cooldown=0", "--cluster_time_out=60",
                      "--grace_period=5", *options, str(TRAIN), *job)


def final_digests(log_dir: Path) -> dict[int, str]:
    """Each rank's ``params_sha256`` from its ``train_end`` event (its last, if several)."""
    return {e["rank"]: e["params_sha256"] for e in events(log_dir, "train_end")}


JOB_END = 150
"""Seconds a faulty job may take to end (a fault-free one takes about 10 s alone)."""
EVENT = 45
"""Seconds to wait for one event of a recovery (one takes 3 to 10 s on 2 busy cores)."""
START = 120
"""Seconds to wait for a job just started to reach a step: every process imports torch
first, and a two-node job took over 45 s to reach step 30 on 2 cores at load 12."""


def wait_job(proc: subprocess.Popen[str]) -> str:
    """Wait for tftrun to end; return its output (to show when an assertion fails)."""
    stdout, stderr = proc.communicate(timeout=JOB_END)
    return stdout + stderr


def worker_launches(log_dir: Path) -> list[tuple[int, int]]:
    """(rank, pid) of every worker process tftrun started, in order."""
    return [(e["rank"], e["pid"]) for e in events(log_dir, "spawn") if e["role"] == "worker"]


def assert_recovered(log_dir: Path, first: dict[int, int], killed: list[int],
                     reference: dict[int, str]) -> None:
    """Only the ``killed`` ranks were started again (each once more per kill), the other
    ranks kept their first process, and every rank ended bitwise equal to ``reference``."""
    launches = worker_launches(log_dir)
    for rank, pid in first.items():
        pids = [p for r, p in launches if r == rank]
        assert pids[0] == pid
        assert len(pids) == 1 + killed.count(rank), (rank, pids)
        assert len(set(pids)) == len(pids)
    assert not any(e["what"] == "workers" for e in events(log_dir, "restart"))
    assert final_digests(log_dir) == reference
    [end] = events(log_dir, "job_end")
    assert (end["exitcode"], end["restarts"], end["relaunches"]) == (0, 0, len(killed))
