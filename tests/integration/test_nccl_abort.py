"""The NCCL path of a survivor between several GPUs (recovery/runtime/group.py): a peer's
``kill -9`` leaves its collective waiting; the survivor aborts the group, as torch
documents it, and forms a new one in the same process. Needs two GPUs (one GPU cannot
hold two NCCL ranks); bench/gpu_check.py checks the one-rank form, abort and re-form."""

from __future__ import annotations

import signal
import sys

import pytest

from support import BIN, run_together

pytestmark = pytest.mark.multigpu


def test_a_survivor_aborts_its_nccl_group_and_forms_a_new_one_alone(free_port: int) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    survivor, killed = run_together(
        [[sys.executable, str(BIN / "nccl_survivor.py"), str(rank), str(free_port)] for rank in (0, 1)],
        timeout=180)
    assert killed[0] == -signal.SIGKILL, killed[2][-2000:]
    status, out, err = survivor
    # Not ended by torch's watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING=1 would tear it down).
    assert status == 0, err[-2000:]
    [line] = [line for line in out.splitlines() if line.startswith("second all_reduce")]
    print(line)
    assert line.endswith("alone: sum 1.0")
    assert float(line.split("aborted in ")[1].split(" s")[0]) < 30
