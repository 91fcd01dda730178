"""How fast the supervisor notices a death among many trivial workers.

    python bench/death_detection.py [--workers 128] [--kills 5] [--json]

Starts tftrun with N workers that only sleep, `kill -9`s one of them K times (tftrun
restarts the group each time) and reports the delay from the kill to the `exit` event
in events.jsonl. Target (docs/benchmarks.md): median < 100 ms with 128 workers.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from common import SCRIPTS, add_json_flag, emit, median, tftrun_cmd

from recovery.events import read_events


def wait_for_spawns(log_dir: Path, count: int, restart_count: int, timeout: float = 120) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = {e["rank"]: e["pid"] for e in read_events(log_dir)
                if e["event"] == "spawn" and e["role"] == "worker"
                and e["restart_count"] == restart_count}
        if len(pids) == count:
            return pids
        time.sleep(0.05)
    raise TimeoutError(f"the workers of restart {restart_count} did not all start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=128)
    parser.add_argument("--kills", type=int, default=5)
    add_json_flag(parser)
    args = parser.parse_args()
    delays = []
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "logs"
        cmd = tftrun_cmd(args.workers, log_dir, str(SCRIPTS / "sleeper.py"),
                         extra=(f"--max_restarts={args.kills}", "--grace_period=5"))
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for attempt in range(args.kills):
                victim = wait_for_spawns(log_dir, args.workers, attempt)[args.workers // 2]
                killed_at = time.time()
                os.kill(victim, signal.SIGKILL)
                while not (seen := [e for e in read_events(log_dir)
                                    if e["event"] == "exit" and e["pid"] == victim]):
                    time.sleep(0.01)
                delays.append(seen[0]["ts"] - killed_at)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    target_s = 0.1
    result = {"workers": args.workers, "delays_s": delays, "median_s": median(delays),
              "target_s": target_s, "met": median(delays) < target_s}
    emit(result, args.json, [f"death noticed, {args.workers} workers: delays "
                             + ", ".join(f"{d * 1000:.1f} ms" for d in delays),
                             f"median {median(delays) * 1000:.1f} ms (target < 100 ms)"])


if __name__ == "__main__":
    main()
