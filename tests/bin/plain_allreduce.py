"""A plain torchrun-style script (knows nothing of tftrun): env:// gloo, a few all_reduces.

Usage: plain_allreduce.py STEPS OUT_DIR
Each rank writes OUT_DIR/env_<rank>.json (the env contract it saw) and the final value.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

steps, out_dir = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.tensor([float(rank + 1)])
for _ in range(steps):
    dist.all_reduce(value)
    value /= dist.get_world_size()
print(f"rank {rank} done value={value.item()}", flush=True)
with open(os.path.join(out_dir, f"env_{rank}.json"), "w") as f:
    json.dump({"env": dict(os.environ), "value": value.item(),
               "world_size": dist.get_world_size()}, f)
dist.destroy_process_group()
