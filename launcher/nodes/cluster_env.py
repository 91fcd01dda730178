"""This node's place in the job, read from Slurm or Kubernetes when the flags leave it out.

A flag always wins; Slurm is read only inside an ``srun`` step, so a tftrun started in the
batch script itself is a one-node job (docs/multi-node.md#slurm-and-kubernetes).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from launcher.errors import ConfigError
from recovery import env as names

__all__ = ["NodePlace", "DEFAULT_MASTER_ADDR", "expand_hostlist", "resolve_place",
           "fill_from_cluster"]

DEFAULT_MASTER_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class NodePlace:
    """Where this tftrun sits in the job: as the flags give it (None: left out), or resolved by
    :func:`resolve_place`."""

    node_rank: int | None = None
    """None: neither the flag nor the cluster manager says (launcher/nodes/ranks.py)."""
    nnodes: int | None = None
    """None: neither ``--nnodes`` nor the cluster manager says (``--worker_num`` decides)."""
    master_addr: str | None = None
    """Never None once resolved."""
    note: str = ""
    """Which values came from the environment, e.g. ``from Slurm: node_rank=1 ...``; empty
    when none did."""


# ---------------------------------------------------------------- Slurm hostlists

_NUMBERS = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_Group = tuple[tuple[int, int, int], ...]
"""A bracket group's ranges: (low, high, width); Slurm pads every number to the width the
range's low end is written in."""


def expand_hostlist(hostlist: str) -> Iterator[str]:
    """The hosts of a Slurm hostlist (``node[01-03,07],gpu-a[1-2]``), in Slurm's order; the
    whole list is checked first (ValueError), the hosts made lazily, so that taking the first
    of a huge allocation is cheap."""
    patterns = [_parse_pattern(expr, hostlist) for expr in _split_top_level(hostlist) if expr]
    return (host for literals, groups in patterns for host in _hosts(literals, groups))


def _hosts(literals: tuple[str, ...], groups: tuple[_Group, ...]) -> Iterator[str]:
    """The hosts of one expression, e.g. ``rack[1-2]-n[01-04,07]``: literals around bracket groups."""
    if not groups:
        yield literals[0]
        return
    for low, high, width in groups[0]:
        for n in range(low, high + 1):
            for rest in _hosts(literals[1:], groups[1:]):
                yield literals[0] + str(n).zfill(width) + rest


def _split_top_level(hostlist: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(hostlist):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(hostlist[start:at])
            start = at + 1
        if depth not in (0, 1):
            raise ValueError(f"bad Slurm hostlist {hostlist!r}: unbalanced brackets")
    if depth:
        raise ValueError(f"bad Slurm hostlist {hostlist!r}: unbalanced brackets")
    parts.append(hostlist[start:])
    return [part.strip() for part in parts]


def _parse_pattern(expr: str, hostlist: str) -> tuple[tuple[str, ...], tuple[_Group, ...]]:
    pieces = re.split(r"\[([^\[\]]*)\]", expr)
    literals, groups = tuple(pieces[0::2]), pieces[1::2]
    if any("[" in lit or "]" in lit for lit in literals):
        raise ValueError(f"bad Slurm hostlist {hostlist!r}: unbalanced brackets in {expr!r}")
    return literals, tuple(_parse_group(group, hostlist) for group in groups)


def _parse_group(group: str, hostlist: str) -> _Group:
    ranges = []
    for item in group.split(","):
        match = _NUMBERS.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"bad Slurm hostlist {hostlist!r}: {item!r} is not N or N-M")
        low_text, high_text = match.groups()
        low, high = int(low_text), int(high_text if high_text is not None else low_text)
        if high < low:
            raise ValueError(f"bad Slurm hostlist {hostlist!r}: range {item!r} runs backwards")
        ranges.append((low, high, len(low_text)))
    return tuple(ranges)


# ---------------------------------------------------------------- the cluster managers

def _int_var(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} is negative")
    return value


def _from_slurm(env: Mapping[str, str], given: NodePlace) -> NodePlace:
    tasks = _int_var(env, names.SLURM_NTASKS)
    reads_tasks = given.node_rank is None or given.nnodes is None
    if (reads_tasks and names.SLURM_STEP_NUM_NODES in env
            and _int_var(env, names.SLURM_STEP_NUM_NODES) != tasks):
        raise ConfigError(
            f"tftrun runs once per node, but this srun step has {names.SLURM_NTASKS}={tasks} "
            f"on {names.SLURM_STEP_NUM_NODES}={env[names.SLURM_STEP_NUM_NODES]} nodes: start "
            "it with srun --ntasks-per-node=1, or give --node_rank and --nnodes")
    nodelist = env.get(names.SLURM_STEP_NODELIST) or env.get(names.SLURM_JOB_NODELIST)
    master = None
    if nodelist and given.master_addr is None:  # a bad list does not matter then
        try:
            master = next(expand_hostlist(nodelist), None)
        except ValueError as err:
            raise ConfigError(f"{err}; give --master_addr") from None
    return NodePlace(_int_var(env, names.SLURM_PROCID), tasks, master)


def _from_kubernetes(env: Mapping[str, str]) -> NodePlace:
    return NodePlace(_int_var(env, names.JOB_COMPLETION_INDEX), None,
                     env.get(names.MASTER_ADDR) or None)


def _from_cluster(env: Mapping[str, str], given: NodePlace) -> tuple[NodePlace, str]:
    """What the cluster manager says about this node, and its name; empty outside one."""
    if names.SLURM_STEP_ID in env and names.SLURM_PROCID in env and names.SLURM_NTASKS in env:
        return _from_slurm(env, given), "Slurm"
    if names.JOB_COMPLETION_INDEX in env:
        return _from_kubernetes(env), "Kubernetes"
    return NodePlace(), ""


_FLAGS = ("node_rank", "nnodes", "master_addr")
"""The fields of :class:`NodePlace` a flag or the cluster manager gives."""


def resolve_place(given: NodePlace, env: Mapping[str, str]) -> NodePlace:
    """Flags first (``given``, None: left out), then the cluster manager in ``env``, then
    the defaults (``127.0.0.1``; ``node_rank`` and ``nnodes`` may stay None)."""
    found, manager = _from_cluster(env, given)
    taken = {name: getattr(found, name) for name in _FLAGS
             if getattr(given, name) is None and getattr(found, name) is not None}
    place = replace(given, **taken)
    if manager == "Kubernetes" and place.node_rank and place.master_addr is None:
        raise ConfigError(
            f"in a Kubernetes indexed Job, give --master_addr or {names.MASTER_ADDR}: the "
            "address of index 0's pod, e.g. <job>-0.<headless service>")
    note = " ".join(f"{name}={value}" for name, value in taken.items())
    return replace(place, master_addr=place.master_addr or DEFAULT_MASTER_ADDR,
                   note=f"from {manager}: {note}" if note else "")


def fill_from_cluster(node_rank: int | None, nnodes: int | None,
                      master_addr: str | None) -> tuple[int | None, int | None, str]:
    """tftrun's flags with the left-out ones filled from this process's environment, said on
    stderr so that each node's output shows where it thinks it is."""
    placement = resolve_place(NodePlace(node_rank, nnodes, master_addr), os.environ)
    if placement.note:
        print(f"tftrun: {placement.note}", file=sys.stderr)
    return placement.node_rank, placement.nnodes, placement.master_addr
