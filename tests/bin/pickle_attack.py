"""Test helper: rank 0 is a malicious peer in a replica recovery; the others receive from it.

Started with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, and argv[1] a path that must
never be created. Rank 0 speaks the wire of a state broadcast (an int64 length, then the
bytes as uint8) and sends two payloads whose unpickling would create that path: a raw
pickle and a ``torch.save`` file; then it announces a payload four times the host's memory
(and sends nothing after it). Every other rank takes each one as a replica's state
(``broadcast_plain``) and prints, as JSON, what happened to each.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys

import psutil
import torch
import torch.distributed as dist

from recovery.train.collectives import broadcast_plain

ANY_SIZE = 1 << 62
"""No bound of the receiver's own: the host's memory is what refuses the last payload."""


class Payload:
    """Unpickling it calls ``os.mkdir(path)``: code of the sender's choosing."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (self.path,)


def attack(payloads: list[bytes]) -> None:
    for data in payloads:
        dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), src=0)
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), src=0)
    dist.broadcast(torch.tensor([4 * psutil.virtual_memory().total], dtype=torch.int64), src=0)


def receive(count: int) -> list[str]:
    outcomes = []
    for _ in range(count):
        try:
            got = broadcast_plain(None, source=0, most=ANY_SIZE)
            outcomes.append(f"loaded {type(got).__name__}")
        except Exception as err:  # noqa: BLE001 - the outcome is what the test checks
            outcomes.append(f"refused {type(err).__name__}")
    return outcomes


def main() -> None:
    marker = sys.argv[1]
    dist.init_process_group("gloo")
    as_file = io.BytesIO()
    torch.save({"model": Payload(marker)}, as_file)
    payloads = [pickle.dumps({"model": Payload(marker)}), as_file.getvalue()]
    if dist.get_rank() == 0:
        attack(payloads)
    else:
        print(json.dumps(receive(len(payloads) + 1)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
