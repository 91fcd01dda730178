"""Bench job: join the gloo group, do one all_reduce, record when (OUT_DIR/first_step_<rank>)."""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
with open(os.path.join(sys.argv[1], f"first_step_{dist.get_rank()}"), "w") as f:
    f.write(repr(time.time()))
dist.destroy_process_group()
