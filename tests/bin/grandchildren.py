"""Test helper: a worker that starts grandchildren, then waits to be killed.

Usage: grandchildren.py OUT_DIR
It starts a ``sleep`` subprocess and a DataLoader with two worker processes, then writes
their pids as JSON to OUT_DIR/<incarnation>.json (written whole, then renamed).
"""

import json
import os
import subprocess
import sys
import time

import torch
from torch.utils.data import DataLoader

from recovery import env as names

out_dir = sys.argv[1]
sleeper = subprocess.Popen(["sleep", "600"])
loader = iter(DataLoader(torch.arange(64), batch_size=4, num_workers=2))
next(loader)  # the loader's processes run now
pids = [sleeper.pid, *(worker.pid for worker in loader._workers)]
path = os.path.join(out_dir, f"{os.environ[names.TFT_INCARNATION]}.json")
with open(path + ".tmp", "w") as file:
    json.dump(pids, file)
os.rename(path + ".tmp", path)
while True:
    time.sleep(600)
