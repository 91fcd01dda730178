"""Test helper: a network peer without the token that records a job's store and writes
what it recorded back later (issue 38), as anyone who reaches the port can.

Usage: store_replay.py MODE HOST PORT SECONDS ARG
Modes, each for SECONDS:

* ``record FILE``: every 20 ms, lists the store's keys and reads each (the request
  queue, its replies and the news counter aside), adding every value not seen yet to
  FILE (JSON: key -> values, base64); ends early, FILE written, once the store is gone.
* ``replay FILE``: waits for a store at HOST:PORT, then writes FILE's values back to
  their keys every 20 ms, each key's values in turn; a store that goes away is waited
  for again.
* ``copy FROM_HOST:FROM_PORT``: writes the values of FROM's keys ``tft/job*`` (another
  job's identity) to the same keys of HOST:PORT, every millisecond.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

HOST, PORT, SECONDS, ARG = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
DEADLINE = time.monotonic() + SECONDS
UNRECORDED = ("tft/requests", "tft/reply/", "tft/news")


def connect(host: str, port: int) -> Any:
    """A client of the store at ``host:port`` once there is one (``None``: past the deadline)."""
    from torch.distributed import TCPStore

    while time.monotonic() < DEADLINE:
        try:
            return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=5))
        except Exception:  # not up yet (torch raises several kinds)
            time.sleep(0.05)
    return None


def record(path: str) -> None:
    store = connect(HOST, PORT)
    seen: dict[str, list[str]] = {}
    while store is not None and time.monotonic() < DEADLINE:
        try:
            for key in store.list_keys():
                if key.lstrip("/").startswith(UNRECORDED):
                    continue
                value = base64.b64encode(store.get(key)).decode()
                if value not in seen.setdefault(key, []):
                    seen[key].append(value)
        except Exception:  # the job ended: its store is gone
            break
        save(path, seen)
        time.sleep(0.02)
    save(path, seen)


def save(path: str, seen: dict[str, list[str]]) -> None:
    with open(path + ".tmp", "w") as file:
        json.dump(seen, file)
    os.replace(path + ".tmp", path)


def replay(path: str) -> None:
    with open(path) as file:
        recorded = {key: [base64.b64decode(v) for v in values]
                    for key, values in json.load(file).items()}
    passes = 0
    while (store := connect(HOST, PORT)) is not None:
        try:
            while time.monotonic() < DEADLINE:
                for key, values in recorded.items():
                    store.set(key, values[passes % len(values)])
                passes += 1
                time.sleep(0.02)
            return
        except Exception:  # the store went away: wait for the next one
            time.sleep(0.05)


def copy(source: str) -> None:
    host, _, port = source.rpartition(":")
    origin, store = connect(host, int(port)), connect(HOST, PORT)
    if origin is None or store is None:
        return
    values = {key: origin.get(key) for key in origin.list_keys() if key.startswith("tft/job")}
    while time.monotonic() < DEADLINE:
        for key, value in values.items():
            store.set(key, value)
        time.sleep(0.001)


if __name__ == "__main__":
    {"record": record, "replay": replay, "copy": copy}[sys.argv[1]](ARG)
