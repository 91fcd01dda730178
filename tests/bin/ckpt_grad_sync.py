"""Test helper: one rank of all_reduce_gradients over gloo; prints the averaged gradients.

Started with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set. Rank r's gradients are
(r + 1) times a fixed pattern, in two dtypes; one parameter has no gradient.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from recovery.train.grad_sync import all_reduce_gradients


def main() -> None:
    dist.init_process_group("gloo")
    scale = dist.get_rank() + 1
    params = [
        torch.nn.Parameter(torch.zeros(2, 3)),
        torch.nn.Parameter(torch.zeros(4, dtype=torch.float64)),
        torch.nn.Parameter(torch.zeros(3)),  # no gradient
        torch.nn.Parameter(torch.zeros(5)),
    ]
    for index in (0, 1, 3):
        param = params[index]
        param.grad = torch.arange(param.numel(), dtype=param.dtype).view_as(param) * scale
    all_reduce_gradients(params)
    print(json.dumps([None if p.grad is None else p.grad.flatten().tolist() for p in params]), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
