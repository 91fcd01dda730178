"""A plain torchrun-style DDP script: gloo, env://, a small model, 20 SGD steps.

Usage: plain_ddp.py OUT_DIR
Each rank writes OUT_DIR/params_<rank>.json with a digest of its initial and final parameters.
"""

import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def digest(model: torch.nn.Module) -> str:
    hasher = hashlib.sha256()
    for tensor in model.state_dict().values():
        hasher.update(tensor.detach().cpu().numpy().tobytes())
    return hasher.hexdigest()


out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
initial = digest(model)
ddp = DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own data shard
for _ in range(20):
    inputs = torch.randn(8, 16, generator=generator)
    targets = torch.randint(0, 4, (8,), generator=generator)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(ddp(inputs), targets).backward()
    optimizer.step()
with open(os.path.join(out_dir, f"params_{rank}.json"), "w") as f:
    json.dump({"initial": initial, "final": digest(model)}, f)
dist.destroy_process_group()
