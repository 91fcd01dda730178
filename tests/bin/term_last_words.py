"""A worker that runs until SIGTERM, then says so in its log and exits 143.

A stand-in for a rank's last words: the test reads the line to know that the rank got
SIGTERM and its grace period, not a bare SIGKILL.
"""

import signal
import sys
import time


def on_term(_signum: int, _frame: object) -> None:
    print("got SIGTERM: last words written", flush=True)
    sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
print("running", flush=True)
while True:
    time.sleep(0.05)
