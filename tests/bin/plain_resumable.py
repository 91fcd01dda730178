"""A plain torchrun-style training loop that saves and reloads its own checkpoint.

Usage: plain_resumable.py STEPS CKPT_DIR [FAIL_RANK FAIL_CODE]
Every rank keeps the same all_reduce'd value; rank 0 saves (step, value) after every step
to CKPT_DIR/state.pt, and on start every rank resumes from that file, as a torchrun user's
script must. With FAIL_RANK and FAIL_CODE, that rank prints a last words and exits FAIL_CODE at
step 2 of every attempt (a negative FAIL_CODE: it kills itself with that signal).
"""

import os
import sys
import time

import torch
import torch.distributed as dist

steps, ckpt_dir = int(sys.argv[1]), sys.argv[2]
fail_rank = int(sys.argv[3]) if len(sys.argv) > 3 else -1
fail_code = int(sys.argv[4]) if len(sys.argv) > 4 else 0
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"world={dist.get_world_size()} rank={rank}", flush=True)
path = os.path.join(ckpt_dir, "state.pt")
start, value = 0, torch.tensor([1.0])
if os.path.exists(path):
    saved = torch.load(path)
    start, value = saved["step"], saved["value"]
    print(f"resumed from step={start}", flush=True)
for step in range(start, steps):
    if rank == fail_rank and step == 2:
        print("about to fail on purpose", flush=True)
        if fail_code < 0:
            os.kill(os.getpid(), -fail_code)
        # At once, without the interpreter's teardown: a teardown closes the group's
        # sockets first, and a peer's failed collective could end that peer before this
        # process is seen to exit, making it the failure the launcher reports first.
        os._exit(fail_code)
    dist.all_reduce(value)
    value /= dist.get_world_size()
    value += 1
    if rank == 0:
        torch.save({"step": step + 1, "value": value}, path + ".tmp")
        os.replace(path + ".tmp", path)
    print(f"step={step + 1}", flush=True)
    time.sleep(0.05)  # the "work" of a step, so that a test can kill a rank mid-run
print(f"done value={value.item()}", flush=True)
dist.destroy_process_group()
