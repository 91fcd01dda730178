"""One of two ranks on two GPUs in an NCCL group formed by recovery (recovery/runtime/group.py):
``nccl_survivor.py RANK PORT``.

Both all-reduce once; then rank 1 ``kill -9``s itself, and rank 0, the survivor, starts a
second all-reduce that waits on the dead peer, aborts the group (``group.retire``) and
forms a new one alone, as a survivor of a peer's death does. Rank 0 prints one line:
``second all_reduce done before the abort: B; aborted in S s; alone: sum X``.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from recovery.runtime import group

PATIENCE = 3.0
"""Seconds the survivor's second all-reduce is given before it is aborted."""

rank, port = int(sys.argv[1]), int(sys.argv[2])
torch.cuda.set_device(rank)
store = dist.TCPStore("127.0.0.1", port, 2, rank == 0)
assert group.connect("nccl", dist.PrefixStore("gen0/", store), rank, 2, 60.0, None)
total = torch.ones(1, device="cuda")
dist.all_reduce(total)
torch.cuda.synchronize()
assert total.item() == 2.0, total
store.set(f"through/{rank}", "1")
store.wait(["through/0", "through/1"])
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
work = dist.all_reduce(torch.ones(1, device="cuda"), async_op=True)
deadline = time.monotonic() + PATIENCE
while not work.is_completed() and time.monotonic() < deadline:
    time.sleep(0.05)
done = work.is_completed()
started = time.monotonic()
del work
group.retire()
aborted = time.monotonic() - started
assert group.connect("nccl", dist.PrefixStore("gen1/", store), 0, 1, 60.0, None)
alone = torch.ones(1, device="cuda")
dist.all_reduce(alone)
torch.cuda.synchronize()
print(f"second all_reduce done before the abort: {done}; aborted in {aborted:.3f} s; "
      f"alone: sum {alone.item()}", flush=True)
dist.destroy_process_group()
