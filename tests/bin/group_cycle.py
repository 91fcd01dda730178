"""Test helper: one of two ranks going through three generations with recovery/runtime/group.py.

    group_cycle.py RANK PORT

* gen0: rank 0 alone tries to connect (rank 1 never comes): it must fail within the
  1 s rendezvous bound and leave this process able to form the next group.
* gen1: both meet and connect; rank 0 starts an all-reduce that rank 1 never joins, and
  retires the group with it in flight; rank 1 leaves gen1 keeping a reference to it, so
  that rank 0's collective stays blocked.
* gen2: both meet and connect and all-reduce; then rank 1 frees its gen1 group, which
  releases rank 0's blocked collective.

Rank 0 prints what it saw as one JSON object.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from recovery.runtime import group

GROUP_TIMEOUT = timedelta(seconds=60)


def join(store: dist.TCPStore, generation: int, rank: int) -> bool:
    prefixed = dist.PrefixStore(f"gen{generation}/", store)
    return (group.meet(prefixed, rank, 2, lambda: False, time.monotonic() + 30)
            and group.connect("gloo", prefixed, rank, 2, 10.0, GROUP_TIMEOUT))


def summed() -> float:
    ones = torch.ones(1)
    dist.all_reduce(ones)
    return float(ones.item())


def main() -> None:
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=60))
    seen: dict[str, object] = {}
    if rank == 0:
        started = time.monotonic()
        seen["gen0_formed"] = group.connect("gloo", dist.PrefixStore("gen0/", store), 0, 2, 1.0,
                                            GROUP_TIMEOUT)
        seen["gen0_seconds"] = time.monotonic() - started
    assert join(store, 1, rank)
    seen["gen1_sum"] = summed()
    if rank == 0:
        work = dist.all_reduce(torch.ones(1000), async_op=True)
        started = time.monotonic()
        group.retire()
        seen["retire_seconds"] = time.monotonic() - started
        seen["blocked_while_the_peer_holds_it"] = group.exit_blocked(0.5)
        del work
        store.set("retired", "1")
        assert join(store, 2, rank)
        seen["gen2_sum"] = summed()
        store.wait(["released"])
        seen["blocked_after_the_peer_freed_it"] = group.exit_blocked(20.0)
        print(json.dumps(seen), flush=True)
    else:
        store.wait(["retired"])
        held = [dist.group.WORLD]
        dist.destroy_process_group()
        assert join(store, 2, rank)
        summed()
        held.clear()
        gc.collect()
        store.set("released", "1")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
