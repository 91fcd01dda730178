"""torchrun's and msrun's option values, read with their meaning (docs/from-torchrun.md): pure functions;
each bad value is a ConfigError naming what to use instead."""

from __future__ import annotations

import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import ConfigError
from launcher.procs.cores import node_cores

__all__ = [
    "Entry", "parse_nnodes", "resolve_nproc", "parse_endpoint", "parse_rdzv_conf",
    "parse_std", "console_ranks", "parse_signals", "strip_python",
    "RDZV_BACKENDS", "RDZV_CONF_HONOURED", "DEFAULT_RDZV_PORT", "STD_ALL",
]

RDZV_BACKENDS = ("c10d", "static")
"""torchrun's backends whose meaning tftrun has: node 0 hosts the store at the endpoint."""
RDZV_CONF_HONOURED = {"join_timeout": "cluster_time_out", "last_call_timeout": "last_call"}
"""``--rdzv_conf`` keys tftrun honours → the tftrun option they set."""
DEFAULT_RDZV_PORT = 29400
"""torchrun's port for an ``--rdzv_endpoint`` given without one."""
STD_NONE, STD_OUT, STD_ERR, STD_ALL = 0, 1, 2, 3
"""torchrun's ``Std`` flags, as ``--redirects`` and ``--tee`` spell them."""


def parse_nnodes(text: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` (torchrun's elastic range) → (MIN, MAX); ``N`` is ``N:N``."""
    parts = text.split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        raise ConfigError(f"--nnodes={text}: give a node count N or MIN:MAX") from None
    if len(parts) > 2 or low < 1 or high < low:
        raise ConfigError(f"--nnodes={text}: give a node count N >= 1 or MIN:MAX with "
                          "1 <= MIN <= MAX")
    return low, high


def resolve_nproc(text: str) -> int:
    """``--nproc_per_node``: an integer, or ``cpu``, ``gpu``, ``xpu`` or ``auto`` (torchrun's
    meaning: devices of that kind; ``auto``: the accelerator's devices, else the cores)."""
    try:
        return int(text)
    except ValueError:
        pass
    if text == "cpu":
        return len(node_cores())  # torch's rule: the cores this process may run on
    if text not in ("gpu", "xpu", "auto"):
        raise ConfigError(f"--nproc_per_node={text}: give a count or one of auto, cpu, gpu, xpu")
    import torch  # only here: importing it costs the launcher a second

    if text == "auto":
        return torch.accelerator.device_count() if torch.accelerator.is_available() else len(node_cores())
    device = torch.cuda if text == "gpu" else torch.xpu
    if not device.is_available():
        kind = "CUDA" if text == "gpu" else "XPU"
        raise ConfigError(f"--nproc_per_node={text}: {kind} is not available on this node; "
                          "give a count, or cpu")
    return int(device.device_count())


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST[:PORT]`` (IPv6 in brackets) → host and port; torchrun's port 29400 if none."""
    match = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:\[\]]+)(?::(\d+))?", text.strip())
    if match is None:
        raise ConfigError(f"--rdzv_endpoint={text}: give HOST:PORT, node 0's address and port")
    host = match.group(1) or match.group(3)
    port = match.group(2) or match.group(4)
    return host, DEFAULT_RDZV_PORT if port is None else int(port)


def parse_rdzv_conf(text: str) -> tuple[dict[str, str], list[str]]:
    """``k1=v1,k2=v2`` → the keys tftrun honours (by its option name), and the others."""
    honoured: dict[str, str] = {}
    ignored: list[str] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--rdzv_conf={text}: give key=value pairs separated by commas")
        key = key.strip()
        if key in RDZV_CONF_HONOURED:
            honoured[RDZV_CONF_HONOURED[key]] = value.strip()
        else:
            ignored.append(key)
    return honoured, ignored


def parse_std(text: str, option: str, nproc: int) -> dict[int, int]:
    """``--redirects``/``--tee``: ``N`` for every local rank, or ``rank:N,rank:N`` (torchrun's
    ``Std.from_str``), N in 0..3 (none, stdout, stderr, both) → local rank → N."""
    def flag(value: str) -> int:
        if value.strip() not in ("0", "1", "2", "3"):
            raise ConfigError(f"{option}={text}: give 0-3 (none, stdout, stderr, both), or "
                              "local_rank:N pairs such as 0:3,1:2")
        return int(value)

    if ":" not in text:
        return dict.fromkeys(range(nproc), flag(text))
    found = dict.fromkeys(range(nproc), STD_NONE)
    for item in text.split(","):
        rank, _, value = item.partition(":")
        try:
            found[int(rank)] = flag(value)
        except ValueError:
            raise ConfigError(f"{option}={text}: {item!r} is not local_rank:N") from None
    return found


def console_ranks(redirects: str | None, tee: str | None, ranks_filter: str | None,
                  nproc: int) -> frozenset[int]:
    """The local ranks whose output torchrun would show on its console; tftrun shows a rank's whole log when
    torchrun would show any of its streams."""
    redirected = parse_std(redirects or "0", "--redirects", nproc)
    teed = parse_std(tee or "0", "--tee", nproc)
    allowed = set(range(nproc))
    if ranks_filter:
        try:
            allowed = {int(rank) for rank in ranks_filter.split(",")}
        except ValueError:
            raise ConfigError(f"--local_ranks_filter={ranks_filter}: give local ranks separated "
                              "by commas, e.g. 0,1") from None
    return frozenset(rank for rank in range(nproc) if rank in allowed and (
        redirected.get(rank, STD_NONE) != STD_ALL or teed.get(rank, STD_NONE) != STD_NONE))


_UNHANDLEABLE = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}
"""Signals no process may catch, and SIGCHLD: the supervisor loop's own wake-up."""


def parse_signals(text: str) -> tuple[int, ...]:
    """``--signals_to_handle``: torchrun's comma-separated names, e.g. ``SIGTERM,SIGUSR1``."""
    found: list[int] = []
    for name in filter(None, (part.strip() for part in text.split(","))):
        number = getattr(signal.Signals, name, None) if name.startswith("SIG") else None
        if number is None or number in _UNHANDLEABLE:
            raise ConfigError(f"--signals_to_handle={text}: {name!r} is not a signal that can be "
                              "handled; give names such as SIGTERM,SIGINT,SIGUSR1")
        if int(number) not in found:
            found.append(int(number))
    if not found:
        raise ConfigError("--signals_to_handle is empty; give names such as SIGTERM,SIGINT")
    return tuple(found)


@dataclass(frozen=True)
class Entry:
    """What a worker runs: a script, a module (``-m``) or an executable (``--no_python``)."""

    target: str
    args: tuple[str, ...]
    kind: str = "script"


_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def strip_python(target: Path, args: list[str]) -> Entry:
    """msrun's ``msrun ... python train.py``: a leading ``python`` (or ``pytest``) is not the script; what
    follows is, run with this interpreter."""
    name = str(target)
    if name == "pytest":
        return Entry("pytest", tuple(args), "module")
    if not (_PYTHON.fullmatch(name) or name == sys.executable):
        return Entry(name, tuple(args))
    rest = list(args)
    while rest and rest[0] == "-u":
        rest.pop(0)
    if rest[:1] == ["-m"] and len(rest) > 1:
        return Entry(rest[1], tuple(rest[2:]), "module")
    if not rest or rest[0].startswith("-"):
        raise ConfigError(f"{name} {' '.join(args)}: give the script to run after {name} "
                          "(tftrun runs it with this Python), e.g. python train.py")
    return Entry(rest[0], tuple(rest[1:]))

