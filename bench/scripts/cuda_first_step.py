"""Bench job of bench/gpu_check.py: a plain torchrun script's first step on its device, timed.

    cuda_first_step.py OUT_DIR cuda|cpu

Each rank makes ``LOCAL_RANK`` modulo the GPUs it sees its device (``cuda``), allocates
there, joins the gloo group and all-reduces a tensor on that device, then writes
``OUT_DIR/<rank>.<restart count>.json``: when the script started, when torch was imported,
when the all-reduce was done, the sum, the device, whether torch says the process is a bad
fork (forked from one that had initialised CUDA), and the error if a CUDA call failed.
The first launch then waits to be killed (the check kills a rank; tftrun restarts the
group); a restarted group ends.
"""

import json
import os
import sys
import time

STARTED = time.time()

import torch  # noqa: E402 - the time before it is part of what is measured
import torch.distributed as dist  # noqa: E402

IMPORTED = time.time()
OUT, DEVICE = sys.argv[1], sys.argv[2]
RANK = int(os.environ["RANK"])
RESTART = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
record = {"rank": RANK, "pid": os.getpid(), "started": STARTED, "imported": IMPORTED,
          "bad_fork": torch.cuda._is_in_bad_fork()}
try:
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    total = torch.full((1 << 16,), float(RANK + 1), device=device)
    dist.init_process_group("gloo")
    dist.all_reduce(total)
    if device.type == "cuda":
        torch.cuda.synchronize()
    record.update(first_step=time.time(), sum=total[0].item(), device=str(total.device),
                  world_size=dist.get_world_size())
except Exception as err:  # noqa: BLE001 - the check reports it
    record["error"] = f"{type(err).__name__}: {err}"
path = os.path.join(OUT, f"{RANK}.{RESTART}.json")
with open(path + ".tmp", "w") as out:
    json.dump(record, out)
os.replace(path + ".tmp", path)
if "error" in record:
    sys.exit(1)
if RESTART == 0:
    time.sleep(300)  # killed by the check, or stopped by tftrun's group restart
dist.destroy_process_group()
