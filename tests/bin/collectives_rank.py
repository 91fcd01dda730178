"""Test helper: one rank of recovery.train.collectives over gloo; prints what it received.

Started with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set. Rank r offers r rows
(r, i) for i < r; rank 1 broadcasts a dict holding a tensor (as a replica sends its state).
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from recovery.train.collectives import all_gather_rows, broadcast_plain


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rows = all_gather_rows([(rank, i) for i in range(rank)], 2)
    mine = {"weights": torch.arange(5, dtype=torch.float64) * 1.5, "step": 39} if rank == 1 else None
    state = broadcast_plain(mine, source=1, most=1 << 20)
    print(json.dumps({"rows": rows, "weights": state["weights"].tolist(), "step": state["step"],
                      "same_object": state is mine}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
