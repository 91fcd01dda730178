"""What tftrun's options mean: the parsed command line (msrun's, torchrun's and tftrun's
options) → a LaunchConfig, before any check (``LaunchConfig.validate``)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from launcher.cli.compat import (
    RDZV_BACKENDS,
    RDZV_CONF_HONOURED,
    Entry,
    console_ranks,
    parse_endpoint,
    parse_nnodes,
    parse_rdzv_conf,
    parse_signals,
    resolve_nproc,
    strip_python,
)
from launcher.cli.flags import refuse
from launcher.config import AUTO_NODE_RANK, DEFAULT_MASTER_PORT, LaunchConfig
from launcher.errors import ConfigError
from launcher.nodes.cluster_env import DEFAULT_MASTER_ADDR, fill_from_cluster
from recovery.control.node_range import DEFAULT_LAST_CALL
from recovery.control.stragglers import StragglerSettings
from recovery.timeouts import DEFAULT_CLUSTER_TIME_OUT

__all__ = ["build_config", "START_METHODS", "ALL_RANKS", "TORCHRUN_ONLY"]

TORCHRUN_ONLY = ("standalone", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
                 "rdzv_conf", "module", "no_python", "run_path", "redirects", "tee",
                 "local_ranks_filter", "local_addr")
"""Options msrun does not have: with any of them (or --nnodes) the command line is
torchrun's, and a ``--worker_num`` given is shared out among ``--nnodes`` nodes."""

START_METHODS = ("spawn", "fork", "forkserver")
"""torchrun's choices, accepted; none decides how a worker starts (``--fork_server`` does)."""
ALL_RANKS = -1
"""msrun's ``--tail_worker_log`` default: every worker's log."""


def build_config(params: dict[str, Any]) -> LaunchConfig:
    """The options → what they mean, before any check."""
    p = SimpleNamespace(**params)
    refuse(params)
    _refuse_unsupported(p)
    entry = _entry(p)
    master_addr, master_port, nnodes, cluster_time_out, last_call = _rendezvous(p)
    node_range = None if nnodes is None else parse_nnodes(nnodes)
    node_rank, node_count, master_addr = fill_from_cluster(
        None if p.node_rank == AUTO_NODE_RANK else p.node_rank,
        None if node_range is None else node_range[1], master_addr)
    torchrun_style = nnodes is not None or any(params[name] for name in TORCHRUN_ONLY)
    worker_num, local = _sizes(p, node_count, torchrun_style)
    console = _console(p, local or worker_num)
    config = LaunchConfig(
        script=Path(entry.target), script_args=entry.args, entry=entry.kind,
        worker_num=worker_num, local_worker_num=local, min_worker_num=p.min_worker_num,
        batch_policy=p.batch_policy,
        master_addr=master_addr,
        master_port=DEFAULT_MASTER_PORT if master_port is None else master_port,
        node_rank=node_rank, node_id=p.node_id or "", nnodes=node_count,
        min_nnodes=None if node_range is None else node_range[0], last_call=last_call,
        node_addr=p.node_addr or p.local_addr or "", log_dir=p.log_dir,
        join=p.join or console is not None or p.tail_worker_log is not None,
        console_ranks=console,
        worker_log_name=p.worker_log_name, bind_core=p.bind_core,
        cluster_time_out=cluster_time_out, max_restarts=p.max_restarts,
        node_time_out=cluster_time_out if p.node_time_out is None else p.node_time_out,
        rejoin_cooldown=p.rejoin_cooldown, rejoin_timeout=p.rejoin_timeout,
        monitor_interval=p.monitor_interval,
        heartbeat_timeout=p.heartbeat_timeout, progress_timeout=p.progress_timeout,
        stragglers=StragglerSettings(p.straggler_factor, p.straggler_window,
                                     p.straggler_policy),
        grace_period=p.grace_period if p.shutdown_timeout is None else p.shutdown_timeout,
        restart_policy=p.restart_policy, is_recover=p.is_recover,
        recovery_path=p.recovery_path, enable_tft=p.enable_tft,
        fork_server=p.fork_server,
        progress_interval=p.progress_interval, role=p.role,
        job_id="" if p.standalone or p.rdzv_id in (None, "none") else p.rdzv_id,
        signals_to_handle=parse_signals(p.signals_to_handle),
    )
    if config.node_rank is None and not config.multi_node:
        # A job of one node: a rank left out is 0 (only a node of many asks node 0 for
        # it); validate() checks it with everything else.
        return replace(config, node_rank=0)
    return config


def _refuse_unsupported(p: SimpleNamespace) -> None:
    """Values of torchrun's options without a meaning here: one line each, saying what instead."""
    if p.rdzv_backend is not None and p.rdzv_backend not in RDZV_BACKENDS:
        raise ConfigError(f"--rdzv_backend={p.rdzv_backend}: tftrun's node 0 hosts the store "
                          "itself; give --rdzv_backend=c10d (or static) and --rdzv_endpoint="
                          "<node 0's address>:<port>")
    if p.start_method not in START_METHODS:
        raise ConfigError(f"--start_method={p.start_method}: give one of "
                          f"{', '.join(START_METHODS)}")
    if p.start_method != "spawn":
        print(f"tftrun: --start_method={p.start_method} chooses nothing: workers are forked "
              "from a warm fork server unless --fork_server=False", file=sys.stderr)
    if p.warm_spare is not None:
        print("tftrun: --warm_spare is deprecated and has no effect: the fork server (on by "
              "default) starts every worker and relaunch warm", file=sys.stderr)


def _rendezvous(p: SimpleNamespace) -> tuple[str | None, int | None, str | None, float, float]:
    """Node 0's address and port (None: not given), the node count, ``--cluster_time_out`` and an elastic
    range's last call, from msrun's options, torchrun's ``--rdzv_*`` or ``--standalone`` (which overrides
    address, port and ``--rdzv_endpoint``, as torchrun's does)."""
    honoured, ignored = parse_rdzv_conf(p.rdzv_conf or "")
    master_addr, master_port, nnodes = p.master_addr, p.master_port, p.nnodes
    if p.standalone:
        if nnodes is not None and parse_nnodes(nnodes) != (1, 1):
            raise ConfigError(f"--standalone is one node, but --nnodes={nnodes}; leave one out")
        master_addr, master_port, nnodes = DEFAULT_MASTER_ADDR, 0, "1"
    elif p.rdzv_endpoint:
        master_addr, master_port = parse_endpoint(p.rdzv_endpoint)
    if ignored:
        print(f"tftrun: --rdzv_conf {', '.join(ignored)}: ignored (tftrun honours "
              f"{', '.join(RDZV_CONF_HONOURED)}; see docs/from-torchrun.md)", file=sys.stderr)
    cluster_time_out = (p.cluster_time_out if p.cluster_time_out is not None
                        else float(honoured.get("cluster_time_out", DEFAULT_CLUSTER_TIME_OUT)))
    try:
        last_call = float(honoured.get("last_call", DEFAULT_LAST_CALL))
    except ValueError:
        raise ConfigError(f"--rdzv_conf last_call_timeout={honoured['last_call']}: give "
                          "seconds") from None
    return master_addr, master_port, nnodes, cluster_time_out, last_call


def _sizes(p: SimpleNamespace, node_count: int | None,
           torchrun_style: bool) -> tuple[int, int | None]:
    """``--worker_num`` and this node's worker count: torchrun's ``nnodes x nproc_per_node`` by default; an
    msrun command line without a torchrun option runs all of ``--worker_num`` here unless
    ``--local_worker_num`` says otherwise."""
    nproc = resolve_nproc(p.nproc_per_node) if p.nproc_per_node is not None else None
    local = p.local_worker_num if p.local_worker_num is not None else nproc
    worker_num = p.worker_num
    if worker_num is None:
        worker_num = (node_count or 1) * (local or 1)
    if local is None and (torchrun_style or p.worker_num is None):
        local = worker_num // (node_count or 1)
    return worker_num, local


def _console(p: SimpleNamespace, nproc: int) -> frozenset[int] | None:
    """The local ranks ``--join`` shows when an option narrows them; None when none does."""
    shown = None
    if p.redirects is not None or p.tee is not None or p.local_ranks_filter:
        shown = console_ranks(p.redirects, p.tee, p.local_ranks_filter, nproc)
    if p.tail_worker_log is not None:
        tailed = _tailed(p.tail_worker_log, nproc)
        if tailed is not None:
            shown = tailed if shown is None else shown & tailed
    return shown


def _tailed(text: str, nproc: int) -> frozenset[int] | None:
    """msrun's ``--tail_worker_log``: a local rank, or several separated by commas, below
    ``nproc``; -1: every one (None)."""
    try:
        ranks = {int(part) for part in text.split(",")}
    except ValueError:
        ranks = set()
    if ranks == {ALL_RANKS}:
        return None
    if not ranks or not all(0 <= rank < nproc for rank in ranks):
        raise ConfigError(f"--tail_worker_log={text}: give this node's local ranks (0..{nproc - 1}) "
                          "separated by commas, or -1 for all")
    return frozenset(ranks)


def _entry(p: SimpleNamespace) -> Entry:
    """What the workers run: ``-m``, ``--no_python``, or a script (msrun's ``python`` dropped)."""
    args = list(p.script_args or ())
    if p.module and p.no_python:
        raise ConfigError("give -m/--module or --no_python, not both")
    if p.module:
        entry = Entry(str(p.script), tuple(args), "module")
    elif p.no_python and not p.run_path:  # torchrun: --run_path takes precedence
        entry = Entry(str(p.script), tuple(args), "exec")
    else:
        entry = strip_python(p.script, args)
    return entry
