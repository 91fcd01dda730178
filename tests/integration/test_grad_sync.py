"""all_reduce_gradients averages every gradient across real gloo ranks; alone it does nothing."""

from __future__ import annotations

import json
import os
import sys

import torch

from recovery import env as envnames
from recovery.train.grad_sync import all_reduce_gradients
from support import BIN, run_together


def test_gradients_are_averaged_across_ranks(free_port: int) -> None:
    base = {**os.environ, envnames.WORLD_SIZE: "2", envnames.MASTER_ADDR: "127.0.0.1",
            envnames.MASTER_PORT: str(free_port)}
    base.pop(envnames.TORCHELASTIC_USE_AGENT_STORE, None)
    results = run_together([[sys.executable, str(BIN / "ckpt_grad_sync.py")]] * 2, timeout=60,
                           envs=[{**base, envnames.RANK: str(rank)} for rank in range(2)])
    for status, out, err in results:
        assert status == 0, err
        # Rank 0 had 1x, rank 1 had 2x the pattern: the average is 1.5x, on both.
        assert json.loads(out) == [
            [1.5 * i for i in range(6)], [1.5 * i for i in range(4)], None, [1.5 * i for i in range(5)],
        ]


def test_without_a_process_group_gradients_are_left_alone() -> None:
    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.full((3,), 2.0)
    all_reduce_gradients([param])
    assert param.grad.tolist() == [2.0, 2.0, 2.0]
