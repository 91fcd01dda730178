"""The parts of the CUDA path that a CPU machine can check: the template's ``--device``,
the fork server's refusal of an initialised CUDA, and (``gpu``) the gradient all-reduce's
flags beside CUDA gradients (bench/gpu_check.py runs the rest on a GPU)."""

from __future__ import annotations

import sys

import pytest
import torch

from launcher.procs.fork_server_main import CUDA_INITIALISED, refuse_initialised_cuda
from recovery.train.grad_sync import all_reduce_gradients
from support.mnist import TEMPLATE

sys.path.insert(0, str(TEMPLATE))
import train  # noqa: E402 - the template's folder is not a package


def test_the_template_runs_on_the_cpu_by_default() -> None:
    args = train.parse_args([])
    assert args.device == "cpu"
    assert train.worker_device(args.device, local_rank=3) == torch.device("cpu")


def test_device_cuda_without_cuda_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit) as ended:
        train.parse_args(["--device", "cuda"])
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "--device=cuda: this process sees no CUDA device")


def test_the_fork_server_serves_while_cuda_is_uninitialised() -> None:
    assert not torch.cuda.is_initialized()
    refuse_initialised_cuda()


def test_the_fork_server_refuses_to_serve_once_cuda_is_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    # The flag torch sets when it initialises CUDA (torch.cuda._lazy_init).
    monkeypatch.setattr(torch.cuda, "_initialized", True)
    assert torch.cuda.is_initialized()
    with pytest.raises(SystemExit, match=CUDA_INITIALISED):
        refuse_initialised_cuda()


@pytest.mark.gpu
def test_the_flags_ride_along_with_cuda_gradients(alone: None) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    param = torch.nn.Parameter(torch.zeros(3, device="cuda"))
    param.grad = torch.tensor([1.0, 2.0, 3.0], device="cuda")
    flags = torch.tensor([0.0, 1.0])
    all_reduce_gradients([param], flags=flags, weight=2, divisor=2)
    assert param.grad.tolist() == [1.0, 2.0, 3.0]
    assert flags.tolist() == [0.0, 1.0] and flags.device.type == "cpu"
