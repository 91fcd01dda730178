"""Fixtures of the integration tests: the fault-free run of the main job, made once."""

from __future__ import annotations

import json
import os

import pytest
from filelock import FileLock

from support import TFT_OFF, free_tcp_port, run
from support_mnist import WORKERS, final_digests, mnist_job


@pytest.fixture(scope="session")
def mnist_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Every rank's final ``params_sha256`` in a fault-free run of the main job.

    Fault tests compare against it: a run that recovered must end bitwise equal. One run
    per pytest run: the first worker (pytest-xdist) that needs it makes it, the others
    read its digests from the run's shared temporary folder.
    """
    base = tmp_path_factory.getbasetemp()  # under xdist, a worker's folder in the run's
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "mnist_reference.json"
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
