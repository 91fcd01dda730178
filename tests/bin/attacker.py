"""Test helper: a process on the job's port that holds no token (issue 26).

Usage: attacker.py MODE HOST PORT SECONDS [RATE | NODE FILE [HOW]]
Modes, each for SECONDS:

* ``keys``: every 20 ms, writes what it can to every control key of the store: a
  rendezvous of its own (a dead address) for restarts 0-5 with the restart count raised
  to them, the job identity rewritten (another lineage), garbage in the restart count,
  the job's end, the ready keys, the news counter; and, ahead of every generation it
  sees meet (its keys listed), the keys of the next three generations under the same
  names (and the next three process group numbers), with garbage.
* ``announce``: announces a value of 4 GiB for ``tft/job`` and a request of 4 GiB on the
  queue, sends 1 MiB of each, and holds the connections open.
* ``flood``: pushes RATE junk requests a second (a well-formed header, a wrong MAC).
* ``hide_joins``: touches FILE once connected (it may start before the store is up and
  wait for it), then hides the join key of node NODE of the latest round it finds listed
  (``tft/round/<n>/join/NODE/<mac>``), as fast as the store answers: it deletes it again
  and again (HOW ``delete``), or sets garbage over it (``tamper``) (issue 38); FILE.hidden
  holds the time (unix seconds) it first hid it.
* ``replay_beats``: records two values of node NODE's beat key as they change, touches
  FILE, and from then on sets the key to each of them in turn, every 0.2 s.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import sys
import time
from datetime import timedelta

HOST, PORT, SECONDS = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
GARBAGE = b"\xff\x00 not yours {"
_GEN = re.compile(r"^/?gen(\d+)(-[0-9a-f]*)?/(.*)$")
_GROUP = re.compile(r"^/(\d+)/(.*)$")
_SIGNED = r"/[0-9a-f]{32}$"


def write_keys() -> None:
    from torch.distributed import TCPStore

    store = TCPStore(HOST, PORT, is_master=False, timeout=timedelta(seconds=10))
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        for n in range(6):
            store.set(f"tft/rendezvous/{n}", "127.0.0.1:1")
        store.set("tft/restart_all", "5" if int(time.monotonic() * 10) % 2 else GARBAGE)
        if store.check(["tft/job"]):
            text = store.get("tft/job").decode(errors="replace")
            try:
                job = json.loads(text[text.find("{"):])
                store.set("tft/job", json.dumps({**job, "lineage": "planted"}))
            except ValueError:
                store.set("tft/job", GARBAGE)
        store.set("tft/end", GARBAGE)
        store.set("tft/news", GARBAGE)
        for g in range(12):
            store.set(f"tft/ready/{g}", GARBAGE)
        seen = {m.group(1, 3) for key in store.list_keys() if (m := _GEN.match(key))}
        for generation, rest in seen:
            for ahead in range(int(generation) + 1, int(generation) + 4):
                for name in _group_names(rest):
                    store.set(f"gen{ahead}/{name}", GARBAGE)
        for g in range(12):
            for r in range(8):
                store.set(f"gen{g}/tft/arrived/{r}", "1")
        time.sleep(0.02)


def _group_names(rest: str) -> list[str]:
    """``rest`` (a key of torch's process group, ``/<group>/...``) for this group and the
    next three: each new process group of a process takes the next number."""
    found = _GROUP.match(rest)
    if found is None:
        return [rest]
    first = int(found.group(1))
    return [f"/{n}/{found.group(2)}" for n in range(first, first + 4)]


def _store():  # noqa: ANN202 - torch is imported late: the other modes never load it
    """A client of the store, once it is up (the attacker may be there first)."""
    from torch.distributed import TCPStore

    deadline = time.monotonic() + SECONDS
    while True:
        try:
            socket.create_connection((HOST, PORT), timeout=1).close()
            return TCPStore(HOST, PORT, is_master=False, timeout=timedelta(seconds=10))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _listed(store, pattern: str) -> list[str]:  # noqa: ANN001
    return sorted(key.lstrip("/") for key in store.list_keys() if re.search(pattern, key))


def hide_joins(node: int, connected: str, tamper: bool) -> None:
    store = _store()
    open(connected, "w").close()
    pattern = rf"tft/round/\d+/join/{node}{_SIGNED}"
    newest, listed_at = None, 0.0
    first_hidden: float | None = None
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        if newest is None or time.monotonic() - listed_at > 0.5:  # a later round's?
            rounds = {int(name.split("/")[2]): name for name in _listed(store, pattern)}
            newest, listed_at = rounds.get(max(rounds, default=-1), newest), time.monotonic()
        if newest is None:
            continue  # listed again at once: hidden from the node's first write
        if tamper:
            store.set(newest, GARBAGE)
            store.check([newest])  # paced by the store's answer
            hidden = True
        else:
            hidden = store.delete_key(newest)
        if hidden and first_hidden is None:
            first_hidden = time.time()
            with open(connected + ".hidden", "w") as told:  # when the key was first hidden
                told.write(repr(first_hidden))


def replay_beats(node: int, recorded: str) -> None:
    store = _store()
    pattern = rf"tft/node/{node}/beat{_SIGNED}"
    values: list[bytes] = []
    while len(values) < 2:
        for name in _listed(store, pattern):
            if (value := store.get(name)) not in values:
                values.append(value)
        time.sleep(0.05)
    open(recorded, "w").close()
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        for value in values:
            store.set(name, value)
            time.sleep(0.2)


def _connect() -> socket.socket:
    sock = socket.create_connection((HOST, PORT))
    sock.sendall(struct.pack("<BI", 0, 0x3C85F7CE))  # VALIDATE, the store's magic
    return sock


def _string(text: str) -> bytes:
    data = ("/" + text).encode()
    return struct.pack("<Q", len(data)) + data


def announce() -> None:
    held = []
    for query, key in ((1, "tft/job"), (14, "tft/requests")):  # SET, QUEUE_PUSH
        sock = _connect()
        sock.sendall(bytes([query]) + _string(key) + struct.pack("<Q", 4 << 30))
        try:
            sock.sendall(b"\0" * (1 << 20))
        except OSError:
            pass  # the store refused it and closed the connection
        held.append(sock)
    time.sleep(SECONDS)


def flood(rate: int) -> None:
    sock = _connect()
    junk = (b"tft1 " + b"0" * 64 + b" heartbeat r" + b"1" * 31 + b" " + b"2" * 32 + b" "
            + str(time.time_ns() // 1_000_000).encode() + b"\n{}")
    push = bytes([14]) + _string("tft/requests") + struct.pack("<Q", len(junk)) + junk
    per_tick = max(rate // 50, 1)
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        tick = time.monotonic()
        sock.sendall(push * per_tick)
        time.sleep(max(0.0, 0.02 - (time.monotonic() - tick)))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "keys":
        write_keys()
    elif mode == "announce":
        announce()
    elif mode == "hide_joins":
        hide_joins(int(sys.argv[5]), sys.argv[6], sys.argv[7] == "tamper")
    elif mode == "replay_beats":
        replay_beats(int(sys.argv[5]), sys.argv[6])
    else:
        flood(int(sys.argv[5]))
