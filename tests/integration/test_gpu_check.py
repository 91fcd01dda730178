"""bench/gpu_check.py where there is no GPU: it checks the fork server on the CPU and skips
the rest; its template run, on the CPU, finds what it looks for on a GPU. And the template's
``--device cpu`` trains as the template always did."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from support import REPO, run
from support.mnist import JOB, final_digests, mnist_job

sys.path.insert(0, str(REPO / "bench"))
import gpu_check  # noqa: E402 - bench/ is not a package

CHECK = [sys.executable, str(REPO / "bench" / "gpu_check.py")]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_without_cuda_it_checks_the_fork_server_and_skips_the_rest() -> None:
    if _cuda():
        pytest.skip("this machine has CUDA: test_on_a_gpu_every_check_passes runs the check")
    result = run(CHECK, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["| check | result | figure |", "|---|---|---|"]
    assert lines[2].startswith("| environment | ok | torch ")
    [server] = [line for line in lines if line.startswith("| fork server leaves CUDA uninitialised |")]
    assert server.startswith("| fork server leaves CUDA uninitialised | ok | warm after ")
    assert "CUDA initialised: no" in server
    [skipped] = [line for line in lines if line.startswith("skipped: ")]
    assert skipped.startswith("skipped: no CUDA: forked worker: first CUDA calls, ")
    assert skipped.endswith("NCCL group of one: form, abort, form again")


def test_its_template_run_on_the_cpu_sees_the_uce_the_kill_the_replica_and_equal_hashes(
        tmp_path: Path) -> None:
    template = gpu_check.run_template(tmp_path, "template", "cpu", (), uce=True, timeout=240)
    assert template.rollback("in_place")["step"] == gpu_check.UCE_STEP - 1
    healed = template.rollback("replica")
    assert healed["from_rank"] != gpu_check.KILL_RANK and healed["step"] > gpu_check.KILL_STEP
    assert template.degraded_steps() > 0
    assert 0 < template.first_step_after_kill() < 120
    assert len(template.same_hash()) == 64


def test_the_template_on_device_cpu_ends_bitwise_as_the_reference(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str]) -> None:
    result = run(mnist_job(tmp_path, "cpu", free_port, job=(*JOB, "--device", "cpu")), timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert final_digests(tmp_path / "cpu") == mnist_reference


@pytest.mark.gpu
def test_on_a_gpu_every_check_passes() -> None:
    if not _cuda():
        pytest.skip("needs a CUDA device")
    result = run(CHECK, timeout=400)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| FAIL |" not in result.stdout
