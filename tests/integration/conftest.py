"""Fixtures of the integration tests: the fault-free runs of the main job (on one node and
on two) and of the degraded job, each made once per pytest run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from filelock import FileLock

from support import TFT_OFF, events, free_tcp_port, run
from support.degraded import STEPS, degraded_job, final_loss
from support.mnist import JOB, TRAIN, WORKERS, final_digests, mnist_job
from support.multinode import JOB_TOKEN, finish_ok, job_digests, start_nodes


@pytest.fixture(scope="session")
def mnist_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Every rank's final ``params_sha256`` in a fault-free run of the main job.

    Fault tests compare against it: a run that recovered must end bitwise equal. One run
    per pytest run: the first worker (pytest-xdist) that needs it makes it, the others
    read its digests from the run's shared temporary folder.
    """
    shared = shared_file(tmp_path_factory, "mnist_reference.json")
    with FileLock(f"{shared}.lock"):
        if shared.exists():
            return {int(rank): digest for rank, digest in json.loads(shared.read_text()).items()}
        tmp_path = tmp_path_factory.mktemp("mnist_reference")
        result = run(mnist_job(tmp_path, "reference", free_tcp_port()), timeout=240, env=TFT_OFF)
        assert result.returncode == 0, result.stdout + result.stderr
        digests = final_digests(tmp_path / "reference")
        assert len(digests) == WORKERS and len(set(digests.values())) == 1, digests
        shared.write_text(json.dumps(digests))
        return digests


@pytest.fixture(scope="session")
def degraded_reference(tmp_path_factory: pytest.TempPathFactory) -> float:
    """The final loss of a fault-free run of the degraded job (tests/support/degraded.py).

    A run that trained degraded must end within ``LOSS_TOLERANCE`` of it, after as many
    steps (tests/integration/test_degraded.py, the chaos test's degraded trials). Made
    once per pytest run, as :func:`mnist_reference`.
    """
    shared = shared_file(tmp_path_factory, "degraded_reference.json")
    with FileLock(f"{shared}.lock"):
        if shared.exists():
            return float(json.loads(shared.read_text()))
        tmp_path = tmp_path_factory.mktemp("degraded_reference")
        result = run(degraded_job(tmp_path, free_tcp_port()), timeout=250)
        assert result.returncode == 0, result.stdout + result.stderr
        assert {e["step"] for e in events(tmp_path / "logs", "train_end")} == {STEPS}
        loss = final_loss(tmp_path / "recovery")
        shared.write_text(json.dumps(loss))
        return loss


def shared_file(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """``name`` in the run's shared temporary folder: under xdist, the parent of each
    worker's own."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


@pytest.fixture(scope="session")
def two_nodes_fault_free(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Every rank's final digest in a fault-free 2-node x 2-rank run of the main job. Made
    once per pytest run, as :func:`mnist_reference`."""
    shared = shared_file(tmp_path_factory, "two_nodes_fault_free.json")
    with FileLock(f"{shared}.lock"):
        if shared.exists():
            return {int(rank): digest for rank, digest in json.loads(shared.read_text()).items()}
        tmp_path = tmp_path_factory.mktemp("two_nodes")
        finish_ok(start_nodes(tmp_path, free_tcp_port(), TRAIN, *JOB, env=TFT_OFF))
        # The nodes agreed through node 0's store, which anyone on the port reads: the shared
        # secret went through no key of it, and into no file of either node.
        token = JOB_TOKEN["TFT_JOB_TOKEN"].encode()
        holding = [path for path in tmp_path.rglob("*") if path.is_file() and token in path.read_bytes()]
        assert holding == []
        digests = job_digests(tmp_path)
        shared.write_text(json.dumps(digests))
        return digests
