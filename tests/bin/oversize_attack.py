"""Test helper: rank 0 is a peer that announces more than an honest one sends; rank 1 takes
part in the exchange as a replica recovery does.

Started with RANK, WORLD_SIZE=2, MASTER_ADDR, MASTER_PORT set, and argv[1] the exchange:

* ``rows``: rank 0 announces 100 000 rows in the gathering of the replicas' reports (an
  honest rank sends one) and sends them; rank 1 gathers the reports (``gather_reports``).
* ``state``: rank 0 sends, as a replica's state, a valid ``torch.save`` file of 16 MiB of
  tensors; rank 1, whose own state is a small model and its Adam optimizer, takes it
  (``broadcast_plain``) with the bound of its own state (``state_limit``).

Rank 1 prints, as JSON, what happened, and leaves at once: an attacker still waiting for it
in the exchange is then told by gloo that its peer closed the connection, and leaves too.
"""

from __future__ import annotations

import io
import json
import os
import sys

import torch
import torch.distributed as dist

from recovery.train.collectives import broadcast_plain
from recovery.train.replica import ReplicaReport, gather_reports, state_limit

ROWS = 100_000
STATE_BYTES = 16 << 20


def attack(exchange: str) -> None:
    if exchange == "rows":
        dist.all_gather([torch.zeros(1, dtype=torch.int64) for _ in range(2)],
                        torch.tensor([ROWS], dtype=torch.int64))
        table = torch.ones((ROWS, 3), dtype=torch.int64)
        dist.all_gather([torch.zeros_like(table) for _ in range(2)], table)
    else:
        data = io.BytesIO()
        torch.save({"model": {"weight": torch.zeros(STATE_BYTES // 4)}}, data)
        dist.broadcast(torch.tensor([len(data.getvalue())], dtype=torch.int64), src=0)
        dist.broadcast(torch.frombuffer(bytearray(data.getvalue()), dtype=torch.uint8), src=0)


def receive(exchange: str) -> str:
    try:
        if exchange == "rows":
            reports = gather_reports(ReplicaReport(1, True, 5))
            return f"gathered {len(reports)} reports"
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.Adam(model.parameters())
        own = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        got = broadcast_plain(None, 0, state_limit(own))
        return f"loaded {type(got).__name__}"
    except Exception as err:  # noqa: BLE001 - the outcome is what the test checks
        return f"refused {type(err).__name__}: {err}"


def main() -> None:
    exchange = sys.argv[1]
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        try:
            attack(exchange)
        except Exception:  # noqa: BLE001 - the victim left the exchange: the attack is over
            pass
    else:
        print(json.dumps(receive(exchange)), flush=True)
    os._exit(0)  # leave the exchange as it stands (a peer may still be in it)


if __name__ == "__main__":
    main()
