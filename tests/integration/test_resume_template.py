"""The main job resumes bitwise: 100 steps straight == 50 steps, stop, resume to 100.

Two ranks on the synthetic set (64 steps per epoch, so the resumed half crosses an epoch
boundary), SGD with momentum so that the optimizer has state to restore. The second half
is resumed once by hand (``--is_recover=1``) and once under ``tftrun --is_recover=1``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from recovery import env as envnames
from recovery.ckpt import layout
from recovery.ckpt.restore import load_checkpoint
from support import REPO, free_tcp_port, tftrun_cmd
from support.mnist import NARROW, TEMPLATE, write_mnist

TRAIN = str(TEMPLATE / "train.py")
COMMON = [*NARROW, "--epochs", "2", "--synthetic_size", "4096", "--save_steps", "20", "--momentum", "0.9"]
FINAL = re.compile(r"^final step=(\d+) params_sha256=([0-9a-f]{64})$", re.MULTILINE)
# Inherited settings that would change what a hand-started rank does.
_CONTRACT = (envnames.RANK, envnames.WORLD_SIZE, envnames.TORCHELASTIC_USE_AGENT_STORE,
             envnames.TORCHELASTIC_RESTART_COUNT, envnames.TFT_IS_RECOVER, envnames.DATA_PATH)


@dataclass
class Rank:
    returncode: int
    out: str
    err: str


def run_ranks(world_size: int, args: list[str], recovery_path: Path, **extra_env: str) -> list[Rank]:
    """Start one template process per rank, torchrun-style (rank 0 hosts the store)."""
    base = {k: v for k, v in os.environ.items() if k not in _CONTRACT}
    # One thread per rank, as tftrun (and torchrun) set it: the thread count changes how
    # float sums are split, so runs compared bit for bit must share it.
    base.update({envnames.MS_RECOVERY_PATH: str(recovery_path), envnames.WORLD_SIZE: str(world_size),
                 envnames.MASTER_ADDR: "127.0.0.1", envnames.MASTER_PORT: str(free_tcp_port()),
                 envnames.OMP_NUM_THREADS: "1", **extra_env})
    procs: list[subprocess.Popen[str]] = []
    try:
        for rank in range(world_size):
            procs.append(subprocess.Popen(
                [sys.executable, TRAIN, *args], cwd=REPO, env={**base, envnames.RANK: str(rank)},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            ))
        outputs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return [Rank(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs)]


def final_line(out: str) -> tuple[int, str]:
    match = FINAL.search(out)
    assert match is not None, out
    return int(match[1]), match[2]


def loss_lines(out: str, after: int) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("step=") and int(line.split()[0][5:]) > after]


def ok(ranks: list[Rank]) -> list[Rank]:
    for rank in ranks:
        assert rank.returncode == 0, rank.err
    return ranks


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | list[Rank]]:
    base = tmp_path_factory.mktemp("resume")
    straight = ok(run_ranks(2, [*COMMON, "--max_steps", "100"], base / "straight"))
    half = ok(run_ranks(2, [*COMMON, "--max_steps", "50"], base / "by_hand"))
    shutil.copytree(base / "by_hand", base / "under_tftrun")
    resumed = ok(run_ranks(2, [*COMMON, "--max_steps", "100", "--is_recover=1"], base / "by_hand"))
    return {"base": base, "straight": straight, "half": half, "resumed": resumed}


def assert_same_final_state(straight_dir: Path, resumed_dir: Path) -> None:
    # Global step 100 is step 36 of epoch 2; the resumed run writes with the prefix mnist_1.
    for rank in (0, 1):
        a = load_checkpoint(layout.rank_dir(straight_dir, rank) / "mnist-2_36.ckpt")
        b = load_checkpoint(layout.rank_dir(resumed_dir, rank) / "mnist_1-2_36.ckpt")
        for key in a["model"]:
            assert torch.equal(a["model"][key], b["model"][key]), key
        for index, state in a["optimizer"]["state"].items():
            assert torch.equal(state["momentum_buffer"], b["optimizer"]["state"][index]["momentum_buffer"])
        assert a["position"] == b["position"] == {"epoch": 2, "step_in_epoch": 36, "global_step": 100}


def test_resumed_run_ends_bitwise_equal_to_the_straight_run(runs: dict) -> None:
    straight, half, resumed = runs["straight"], runs["half"], runs["resumed"]
    assert final_line(half[0].out)[0] == 50
    assert final_line(resumed[0].out) == final_line(straight[0].out)
    assert final_line(straight[0].out)[0] == 100
    assert "final step" not in straight[1].out  # only rank 0 reports
    for rank in (0, 1):
        assert f"rank_{rank}/mnist-1_50.ckpt (epoch 1, step 50, global step 50)" in resumed[rank].err
        # Every logged loss after the resume point is the same, to the last printed digit.
        assert loss_lines(resumed[rank].out, 50) == loss_lines(straight[rank].out, 50)
        assert len(loss_lines(straight[rank].out, 0)) == 10
    assert_same_final_state(runs["base"] / "straight", runs["base"] / "by_hand")
    # Gradients were averaged every step: both replicas hold the same parameters.
    replicas = [load_checkpoint(layout.rank_dir(runs["base"] / "straight", r) / "mnist-2_36.ckpt")["model"]
                for r in (0, 1)]
    assert all(torch.equal(replicas[0][key], replicas[1][key]) for key in replicas[0])


def test_tftrun_is_recover_resumes_every_worker_bitwise(runs: dict) -> None:
    base = runs["base"]
    done = subprocess.run(
        tftrun_cmd("--worker_num=2", f"--log_dir={base / 'logs'}", f"--recovery_path={base / 'under_tftrun'}",
                   "--is_recover=1", TRAIN, *COMMON, "--max_steps", "100"),
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k not in _CONTRACT},
    )
    assert done.returncode == 0, done.stderr + done.stdout
    log = (base / "logs" / "worker_0.log").read_text()
    assert final_line(log) == final_line(runs["straight"][0].out)
    assert_same_final_state(base / "straight", base / "under_tftrun")


def test_resuming_with_another_world_size_is_refused_clearly(runs: dict) -> None:
    [alone] = run_ranks(1, [*COMMON, "--max_steps", "100", "--is_recover=1"], runs["base"] / "straight")
    assert alone.returncode == 1
    assert "world size 2, this job has world size 1" in alone.err
    assert "allow_world_size_change" in alone.err
    assert "Traceback" not in alone.err


def test_a_relaunched_worker_resumes_by_itself_on_real_idx_data(tmp_path: Path) -> None:
    write_mnist(tmp_path / "mnist", 96, compress=True)  # 3 steps per epoch
    args = ["--epochs", "5", "--save_steps", "2", "--log_every", "1"]
    [first] = ok(run_ranks(1, [*args, "--max_steps", "7"], tmp_path / "rec", DATA_PATH=str(tmp_path / "mnist")))
    assert final_line(first.out)[0] == 7
    # A restart-all relaunch (TORCHELASTIC_RESTART_COUNT > 0) resumes without --is_recover.
    [again] = ok(run_ranks(1, [*args, "--max_steps", "10"], tmp_path / "rec", DATA_PATH=str(tmp_path / "mnist"),
                           TORCHELASTIC_RESTART_COUNT="1"))
    assert "mnist-3_1.ckpt (epoch 3, step 1, global step 7)" in again.err
    assert [line.split()[0] for line in again.out.splitlines()] == ["step=8", "step=9", "step=10", "final"]
