"""Bench job of bench/gpu_check.py: an NCCL group of one rank formed, aborted and formed
again in one process, by recovery's own calls (recovery/runtime/group.py), as a survivor
does when a peer dies. Prints one JSON line: the seconds each part took, the sums, and the
``TORCH_NCCL_ASYNC_ERROR_HANDLING`` each group formed with.

It starts with the variable at ``1``, as tftrun sets it for every worker.
"""

import json
import os
import time

import torch
import torch.distributed as dist

from recovery.env import TORCH_NCCL_ASYNC_ERROR_HANDLING
from recovery.runtime import group

os.environ[TORCH_NCCL_ASYNC_ERROR_HANDLING] = "1"
torch.cuda.set_device(0)
base = dist.TCPStore("127.0.0.1", 0, 1, True)
result: dict[str, object] = {"before": os.environ[TORCH_NCCL_ASYNC_ERROR_HANDLING]}
for attempt in (1, 2):
    started = time.monotonic()
    formed = group.connect("nccl", dist.PrefixStore(f"gen{attempt}/", base), 0, 1, 60.0, None)
    total = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(total)
    torch.cuda.synchronize()
    result[f"group {attempt}"] = {"formed": formed, "seconds": round(time.monotonic() - started, 3),
                                  "sum": total[0].item(), "backend": dist.get_backend(),
                                  "error_handling": os.environ[TORCH_NCCL_ASYNC_ERROR_HANDLING]}
    started = time.monotonic()
    group.retire()
    result[f"abort {attempt}"] = {"seconds": round(time.monotonic() - started, 3),
                                  "left": not dist.is_initialized()}
print(json.dumps(result), flush=True)
