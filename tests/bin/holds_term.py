"""A plain script (no ``recovery``) whose rank 0 catches SIGTERM and keeps running on its
first launch, as Lightning does, while rank 1 fails once rank 0 is up; on the restart
both exit 0. It shows how long a group restart waits for a worker that ignores SIGTERM."""

import os
import signal
import sys
import time
from pathlib import Path

from recovery import env as names

rank = int(os.environ[names.RANK])
first_launch = os.environ[names.TORCHELASTIC_RESTART_COUNT] == "0"
if not first_launch:
    sys.exit(0)
if rank == 0:
    signal.signal(signal.SIGTERM, lambda *_: print("got SIGTERM: going on", flush=True))
    print("holding", flush=True)
    while True:
        time.sleep(0.05)
log = Path(os.environ[names.TFT_LOG_DIR]) / "worker_0.log"
while not (log.exists() and "holding" in log.read_text()):
    time.sleep(0.05)
sys.exit(1)
