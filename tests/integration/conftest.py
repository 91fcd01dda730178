"""Fixtures of the integration tests: the fault-free run of the main job, made once."""

from __future__ import annotations

import pytest

from support import TFT_OFF, free_tcp_port, run
from support_mnist import WORKERS, final_digests, mnist_job


@pytest.fixture(scope="session")
def mnist_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Every rank's final ``params_sha256`` in a fault-free run of the main job.

    Fault tests compare against it: a run that recovered must end bitwise equal.
    """
    tmp_path = tmp_path_factory.mktemp("mnist_reference")
    result = run(mnist_job(tmp_path, "reference", free_tcp_port()), timeout=240, env=TFT_OFF)
    assert result.returncode == 0, result.stdout + result.stderr
    digests = final_digests(tmp_path / "reference")
    assert len(digests) == WORKERS and len(set(digests.values())) == 1, digests
    return digests
