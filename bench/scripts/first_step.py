"""Bench job: join the gloo group, do one all_reduce, record when (in OUT_DIR, per rank:
``started_<rank>`` as the script begins, ``imported_<rank>`` once torch is imported,
``first_step_<rank>`` after the all_reduce)."""

import os
import sys
import time

STARTED = time.time()

import torch  # noqa: E402 - the time before it is part of what is measured
import torch.distributed as dist  # noqa: E402

IMPORTED = time.time()
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
STEPPED = time.time()
for name, stamp in (("started", STARTED), ("imported", IMPORTED), ("first_step", STEPPED)):
    with open(os.path.join(sys.argv[1], f"{name}_{dist.get_rank()}"), "w") as f:
        f.write(repr(stamp))
dist.destroy_process_group()
