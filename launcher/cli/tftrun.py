"""``tftrun [OPTIONS] SCRIPT [SCRIPT_ARGS...]``: torchrun's command line, msrun's options.
Every option takes both spellings (``--worker_num``, ``--worker-num``) and both forms
(``--opt=value``, ``--opt value``); everything after SCRIPT belongs to the script.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from filelock import FileLock, Timeout

from launcher.cli.common import HELP_OPTIONS, new_app, print_version, run_app
from launcher.cli.flags import (
    COMPAT,
    LAUNCH,
    LOGGING,
    MULTI_NODE,
    RECOVERY,
    FlagCommand,
    flag,
    float_opt,
    opt,
    parse_bool,
    refused_line,
    refused_opt,
)
from launcher.cli.options import build_config
from launcher.config import (
    DEFAULT_PROGRESS_INTERVAL,
    DEFAULT_SIGNALS,
    DEFAULT_WORKER_LOG_NAME,
    LaunchConfig,
    bind_listener,
    with_own_folders,
)
from launcher.errors import ConfigError
from launcher.nodes.job import join_job, keep_job, return_to_job
from launcher.nodes.link import local_address_towards
from launcher.nodes.ranks import place_node
from launcher.procs.spec import signal_names
from launcher.supervisor.loop import Supervisor
from launcher.view.logs import archive_previous_run
from launcher.view.render import make_view
from recovery import env as names
from recovery.ckpt.layout import previous_dir
from recovery.ckpt.lineage import LineageError, join_lineage, open_lineage
from recovery.control.node_range import DEFAULT_LAST_CALL
from recovery.control.signing import WeakToken, checked_strength
from recovery.control.stragglers import DEFAULT_FACTOR, DEFAULT_WINDOW, POLICIES
from recovery.env import DEFAULT_RECOVERY_PATH
from recovery.events import EVENTS_FILE, EventLog
from recovery.quick_exit import skip_final_collections
from recovery.timeouts import (
    DEFAULT_CLUSTER_TIME_OUT,
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_PROGRESS_TIMEOUT,
    DEFAULT_REJOIN_COOLDOWN,
)

__all__ = ["app", "main", "build_config", "config_from_argv", "parse_bool"]

LOCK_FILE = "tftrun.lock"
ROUTE_PROBE_PORT = 29500
"""A port to ask the route to ``--master_addr`` with, when the job's is not known yet (the
route does not depend on it)."""

app = new_app("tftrun", "Launch a fault-tolerant distributed PyTorch job on this node.",
              panels=True)


@app.command(cls=FlagCommand, epilog=refused_line(),
             context_settings={"allow_interspersed_args": False, **HELP_OPTIONS})
def launch(
    script: Annotated[Path, typer.Argument(
        help="The training script (run with this Python), a module with -m, or an executable "
        "with --no_python. msrun's leading 'python' is dropped.", show_default=False)],
    script_args: Annotated[list[str] | None, typer.Argument(
        help="Arguments passed to the script unchanged.", show_default=False)] = None,
    # ------------------------------------------------------------------ launch
    nproc_per_node: Annotated[str | None, opt(
        "nproc_per_node", "Workers on this node: a count, or auto, cpu, gpu, xpu (one per "
        "core or device). [default: 1]", LAUNCH, pet=True)] = None,
    worker_num: Annotated[int | None, opt(
        "worker_num", "msrun's: workers in the whole job, all nodes. [default: nnodes x "
        "nproc_per_node, 1 when neither is given]", LAUNCH)] = None,
    local_worker_num: Annotated[int | None, opt(
        "local_worker_num", "msrun's name for --nproc_per_node (a count). [default: "
        "worker_num, or worker_num / nnodes]", LAUNCH)] = None,
    master_port: Annotated[int | None, opt(
        "master_port", "Port of the scheduler's store on node 0. [default: a free port, "
        "printed; required with several nodes]", LAUNCH, pet=True)] = None,
    module: Annotated[bool, flag(
        "module", "Run SCRIPT as a module, like python -m.", LAUNCH, pet=True, short="-m")] = False,
    no_python: Annotated[bool, flag(
        "no_python", "Run SCRIPT as an executable, not with Python (no fork server).", LAUNCH,
        pet=True)] = False,
    fork_server: Annotated[bool, flag(
        "fork_server", "Fork this node's workers, and their relaunches, from one warm Python "
        "that imported torch once (a Python script or -m module); --no_fork_server: each "
        "starts as a fresh process. [default: on]", LAUNCH, negative=True)] = True,
    bind_core: Annotated[bool, flag(
        "bind_core", "msrun's: pin each worker to its own share of the cores tftrun may use "
        "(consecutive blocks by local rank).", LAUNCH)] = False,
    version: Annotated[bool, typer.Option(
        "--version", help="Print tftrun's version and exit.", callback=print_version("tftrun"),
        is_eager=True, metavar="", show_default=False)] = False,
    # ---------------------------------------------------------------- recovery
    min_worker_num: Annotated[int | None, opt(
        "min_worker_num", "The fewest workers the job trains on while ranks are missing: "
        "below worker_num, the survivors of a death train on at once, with the same global "
        "batch, for a script that uses recovery; equal to worker_num, they wait for the "
        "dead rank, and the run ends bitwise equal to a fault-free one (docs/elastic.md). "
        "[default: 1; worker_num with --nnodes=MIN:MAX]", RECOVERY)] = None,
    batch_policy: Annotated[str, opt(
        "batch_policy", "What a step trains while ranks are missing (--min_worker_num): "
        "'constant' the same global batch (the survivors compute the lost ranks' share), "
        "'shrink' one micro-batch per live rank (torchft's). Sets TFT_BATCH_POLICY for the "
        "workers (docs/elastic.md).", RECOVERY)] = "constant",
    max_restarts: Annotated[int, opt(
        "max_restarts", "Restarts allowed after worker failures before the job stops.",
        RECOVERY, pet=True)] = 3,
    restart_policy: Annotated[str, opt(
        "restart_policy", "On a worker failure: 'all' restarts every worker (torchrun), "
        "'rank' relaunches only the dead ones (scripts using recovery), 'auto' picks per "
        "script.", RECOVERY)] = "auto",
    rejoin_cooldown: Annotated[float, float_opt(
        "rejoin_cooldown", "Seconds a dead worker's node id may not re-register "
        "(msrun's 30 s).", RECOVERY)] = DEFAULT_REJOIN_COOLDOWN,
    rejoin_timeout: Annotated[float | None, float_opt(
        "rejoin_timeout", "With --min_worker_num: seconds a dead worker may take to "
        "register again before it is retired for good and the job trains on without it. "
        f"[default: rejoin_cooldown + {DEFAULT_LAST_CALL:g} (torchrun's last call)]",
        RECOVERY)] = None,
    heartbeat_timeout: Annotated[float, float_opt(
        "heartbeat_timeout", "Seconds without a heartbeat before a worker is declared dead.",
        RECOVERY)] = DEFAULT_HEARTBEAT_TIMEOUT,
    progress_timeout: Annotated[float, float_opt(
        "progress_timeout", "Seconds a worker may stay behind another worker's step of its "
        "generation before it is declared hung.", RECOVERY)] = DEFAULT_PROGRESS_TIMEOUT,
    straggler_factor: Annotated[float, float_opt(
        "straggler_factor", "A rank whose compute time per step stays at least this many "
        "times its peers' median is a straggler.", RECOVERY)] = DEFAULT_FACTOR,
    straggler_window: Annotated[int, opt(
        "straggler_window", "For how many steps in a row it must stay so.",
        RECOVERY)] = DEFAULT_WINDOW,
    straggler_policy: Annotated[str, opt(
        "straggler_policy", "What to do with a straggler: 'report' it (an event, tftctl "
        "status), or 'evict' it (killed and relaunched after its cooldown; the others train "
        "on without it meanwhile, with --min_worker_num below --worker_num).",
        RECOVERY)] = POLICIES[0],
    monitor_interval: Annotated[float, float_opt(
        "monitor_interval", "Seconds between checks of the workers (deaths are seen at "
        "once regardless).", RECOVERY, pet=True)] = 0.1,
    grace_period: Annotated[float, float_opt(
        "grace_period", "Seconds between SIGTERM and SIGKILL when stopping processes.",
        RECOVERY)] = 10.0,
    signals_to_handle: Annotated[str, opt(
        "signals_to_handle", "Signals to tftrun that stop the job in order (workers get them, "
        "exit 128+N), comma-separated names. [default: "
        f"{signal_names(DEFAULT_SIGNALS).replace(',', ', ')}]", RECOVERY,
        pet=True, show_default=False)] = signal_names(DEFAULT_SIGNALS),
    is_recover: Annotated[bool, flag(
        "is_recover", "Resume a dead job from its newest valid checkpoints (of its lineage).",
        RECOVERY)] = False,
    recovery_path: Annotated[Path, opt(
        "recovery_path", "Folder for checkpoints and the scheduler's state; a fresh launch "
        "first moves an earlier job's state in it to previous/<n>/.", RECOVERY)
    ] = Path(DEFAULT_RECOVERY_PATH),
    enable_tft: Annotated[str | None, opt(
        "enable_tft", "Lose-nothing modes in msrun's MS_ENABLE_TFT syntax, e.g. "
        "'{TTP:1,UCE:1,ARF:1}' (the default); a mode left out is off.", RECOVERY)] = None,
    warm_spare: Annotated[int | None, opt(
        "warm_spare", "Deprecated, no effect (a warning says so): relaunched ranks are forked "
        "warm by the fork server; to be removed in a later release.", RECOVERY)] = None,
    # -------------------------------------------------------------- multi-node
    nnodes: Annotated[str | None, opt(
        "nnodes", "Node count N, or an elastic range MIN:MAX (a plain script's workers all "
        "restart with the new WORLD_SIZE when nodes are lost or join). [default: from Slurm, "
        "else 1]", MULTI_NODE, pet=True)] = None,
    node_rank: Annotated[int | None, opt(
        "node_rank", "This node's index; its ranks are node_rank x nproc_per_node + i. "
        "-1 (msrun's default) or left out: from Slurm or Kubernetes, else node 0 is the node "
        "whose address is --master_addr and the others get 1, 2, ... from node 0 in order "
        "of arrival.", MULTI_NODE, pet=True)] = None,
    master_addr: Annotated[str | None, opt(
        "master_addr", "Address of the scheduler (node 0). [default: from Slurm or "
        "Kubernetes, else 127.0.0.1]", MULTI_NODE, pet=True)] = None,
    node_id: Annotated[str | None, opt(
        "node_id", "This node's identity for automatic node ranks: started again with it, "
        "the node gets the rank it had. [default: host name/node address]", MULTI_NODE)] = None,
    node_addr: Annotated[str | None, opt(
        "node_addr", "This node's address, where the other nodes reach its workers and "
        "stores. [default: the address of the interface that reaches --master_addr]",
        MULTI_NODE)] = None,
    cluster_time_out: Annotated[float | None, float_opt(
        "cluster_time_out", "Seconds to wait for the cluster to form. "
        f"[default: {DEFAULT_CLUSTER_TIME_OUT:g}]", MULTI_NODE)] = None,
    node_time_out: Annotated[float | None, float_opt(
        "node_time_out", "Seconds a lost node (its ranks missing, or node 0's scheduler "
        "unreachable) may take to come back before the job ends on every node. "
        "[default: cluster_time_out]", MULTI_NODE)] = None,
    # ----------------------------------------------------------------- logging
    log_dir: Annotated[Path, opt(
        "log_dir", "Folder for the workers' logs, scheduler.log, fork_server.log and "
        "events.jsonl; an earlier run's files there are moved to previous/<n>/.", LOGGING,
        pet=True)] = Path("logs"),
    join: Annotated[bool, flag(
        "join", "Also stream every worker's output here, prefixed with its rank.",
        LOGGING)] = False,
    tail_worker_log: Annotated[str | None, opt(
        "tail_worker_log", "msrun's: stream only these local ranks' logs here, e.g. 0 or 0,2 "
        "(turns --join on); -1: all.", LOGGING)] = None,
    worker_log_name: Annotated[str, opt(
        "worker_log_name", "msrun's: worker r logs to <log_dir>/<name>_<r>.log; {ip} and "
        "{hostname} in the name are this node's.", LOGGING)] = DEFAULT_WORKER_LOG_NAME,
    redirects: Annotated[str | None, opt(
        "redirects", "torchrun's: 3 (or local_rank:3,...) keeps those ranks off the console; "
        "any of --redirects, --tee, --local_ranks_filter streams the other ranks' output here. "
        "Every rank's log file is written regardless.", LOGGING, pet=True, short="-r")] = None,
    tee: Annotated[str | None, opt(
        "tee", "torchrun's: those ranks' output also on the console (see --redirects).",
        LOGGING, pet=True, short="-t")] = None,
    local_ranks_filter: Annotated[str | None, opt(
        "local_ranks_filter", "torchrun's: only these local ranks (e.g. 0,1) on the console.",
        LOGGING, pet=True)] = None,
    progress_interval: Annotated[float, float_opt(
        "progress_interval", "Off a terminal (CI, a pipe): seconds between two progress "
        "lines (each rank's step and steps/s, the ETA, a recovery under way); 0: none.",
        LOGGING)] = DEFAULT_PROGRESS_INTERVAL,
    # ----------------------------------------------------- torchrun/msrun only
    standalone: Annotated[bool, flag(
        "standalone", "torchrun's: one node, a free port (printed), a fresh run id; "
        "--rdzv_* values are ignored.", COMPAT, pet=True)] = False,
    rdzv_backend: Annotated[str | None, opt(
        "rdzv_backend", "torchrun's; c10d or static: node 0's scheduler hosts the store "
        "either way.", COMPAT, pet=True)] = None,
    rdzv_endpoint: Annotated[str | None, opt(
        "rdzv_endpoint", "torchrun's HOST[:PORT]: node 0's address and port (--master_addr, "
        "--master_port; port 29400 if left out).", COMPAT, pet=True)] = None,
    rdzv_id: Annotated[str | None, opt(
        "rdzv_id", "torchrun's job id: the workers' TORCHELASTIC_RUN_ID.", COMPAT, pet=True)] = None,
    rdzv_conf: Annotated[str | None, opt(
        "rdzv_conf", "torchrun's key=value,...: join_timeout sets --cluster_time_out, "
        "last_call_timeout how long an elastic --nnodes=MIN:MAX restart with MIN nodes waits "
        f"for more [default: {DEFAULT_LAST_CALL:g}]; other keys are ignored, with a "
        "warning.", COMPAT, pet=True)] = None,
    local_addr: Annotated[str | None, opt(
        "local_addr", "torchrun's name for --node_addr.", COMPAT, pet=True)] = None,
    run_path: Annotated[bool, flag(
        "run_path", "torchrun's runpy.run_path: SCRIPT runs as a Python file, as without it.",
        COMPAT, pet=True)] = False,
    role: Annotated[str, opt("role", "The workers' ROLE_NAME.", COMPAT, pet=True)] = "default",
    start_method: Annotated[str, opt(
        "start_method", "Accepted for torchrun's command lines: spawn, fork or forkserver. "
        "It chooses nothing: see --fork_server.", COMPAT, pet=True)] = "spawn",
    shutdown_timeout: Annotated[float | None, float_opt(
        "shutdown_timeout", "torchrun's name for --grace_period.", COMPAT, pet=True)] = None,
    event_log_handler: Annotated[str, opt(
        "event_log_handler", "Accepted for torchrun's command lines: tftrun's events go to "
        "<log_dir>/events.jsonl.", COMPAT, pet=True)] = "null",
    # ----------------------------------------- refused: one line each (flags.REFUSED)
    logs_specs: Annotated[str | None, refused_opt("logs_specs")] = None,
    numa_binding: Annotated[str | None, refused_opt("numa_binding")] = None,
    bind_numa: Annotated[str | None, refused_opt("bind_numa")] = None,
    duplicate_stdout_filters: Annotated[str | None, refused_opt("duplicate_stdout_filters")] = None,
    duplicate_stderr_filters: Annotated[str | None, refused_opt("duplicate_stderr_filters")] = None,
    virtual_local_rank: Annotated[bool, refused_opt("virtual_local_rank")] = False,
    sim_level: Annotated[str | None, refused_opt("sim_level")] = None,
    sim_rank_id: Annotated[str | None, refused_opt("sim_rank_id")] = None,
    rank_table_file: Annotated[str | None, refused_opt("rank_table_file")] = None,
) -> int:
    """Launch SCRIPT as data-parallel workers and keep the job alive: a dead worker is
    relaunched, and the others recover in place or restart.

    Examples:
      tftrun train.py                      one worker, a free port (printed)
      tftrun --nproc_per_node=4 train.py --epochs 3
      tftrun --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --master_port=29500 \\
             --nproc_per_node=4 train.py   (the same on node 1 with --node_rank=1)
    """
    return _run(build_config(dict(locals())))


def config_from_argv(argv: Sequence[str]) -> LaunchConfig:
    """The LaunchConfig a command line asks for, unchecked and nothing started (for tests)."""
    command = typer.main.get_command(app)
    with command.make_context("tftrun", list(argv)) as ctx:
        return build_config(dict(ctx.params))


def _run(config: LaunchConfig) -> int:
    """Check ``config``, then run the job on this node; tftrun's exit status."""
    config.validate()
    if config.multi_node and not os.environ.get(names.TFT_JOB_TOKEN):
        raise ConfigError(f"a job of several nodes needs one secret on every node: set "
                          f"{names.TFT_JOB_TOKEN} to the same value on each (e.g. the output of "
                          f"python3 -c 'import secrets; print(secrets.token_hex(16))')")
    try:
        checked_strength(os.environ.get(names.TFT_JOB_TOKEN, ""),
                         allow_weak=os.environ.get(names.TFT_INSECURE_WEAK_TOKEN) == "1")
    except WeakToken as err:
        raise ConfigError(str(err)) from None
    os.umask(os.umask(0) | 0o022)  # nothing tftrun or its children write is world-writable
    config = place_node(replace(config, node_addr=config.node_addr or local_address_towards(
        config.master_addr, config.master_port or ROUTE_PROBE_PORT)))
    with ExitStack() as held:
        config = with_own_folders(config)
        _hold_lock(held, config.log_dir, f"another tftrun job is running with --log_dir {config.log_dir}")
        _hold_lock(held, config.recovery_path,
                   f"another tftrun job is using --recovery_path {config.recovery_path}")
        store_socket = (bind_listener(config.master_addr, config.master_port)
                        if config.hosts_scheduler else None)
        if store_socket is not None:
            held.callback(store_socket.close)
            if config.master_port == 0:
                config = replace(config, master_port=store_socket.getsockname()[1])
                print(f"tftrun: master port {config.master_port} (a free port, picked for this "
                      "job)", file=sys.stderr)
        if not config.hosts_scheduler:
            config = join_job(config)
        elif config.multi_node and not config.is_recover:
            config = return_to_job(config)
        config = replace(config, lineage=_open_lineage(config))
        if config.hosts_scheduler and config.multi_node:
            config = keep_job(config)
        archive_previous_run(config.log_dir, config.worker_log_glob)
        view = make_view(config.log_dir / EVENTS_FILE, config.progress_interval, config.node_title)
        supervisor = Supervisor(config, store_socket, view, EventLog(config.log_dir, config.assigned_rank))
        return supervisor.run()


def _hold_lock(held: ExitStack, directory: Path, busy: str) -> None:
    """Hold ``directory``'s tftrun lock until ``held`` closes; ConfigError(busy) if taken."""
    lock = FileLock(str(directory / LOCK_FILE))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise ConfigError(busy) from None
    held.callback(lock.release)


def _open_lineage(config: LaunchConfig) -> str:
    """The job's lineage; a fresh launch first moves an earlier job's state aside. Only node 0 decides;
    other nodes join its lineage (docs/checkpoints.md#lineage)."""
    try:
        opened = (open_lineage(config.recovery_path, resume=config.is_recover)
                  if config.hosts_scheduler else join_lineage(config.recovery_path, config.lineage))
    except LineageError as err:
        if not config.is_recover:
            raise ConfigError(f"--recovery_path: {err}") from None
        raise ConfigError(
            f"--is_recover=1: {err}; start without --is_recover (they move to "
            f"{previous_dir(config.recovery_path)}/<n>/ and training starts over), or give "
            "another --recovery_path") from None
    except OSError as err:
        raise ConfigError(f"--recovery_path {config.recovery_path}: {err}") from None
    if opened.archived is not None:
        print(f"tftrun: an earlier job's checkpoints in {config.recovery_path} were moved to "
              f"{opened.archived}", file=sys.stderr)
    return opened.lineage


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run_app(app, "tftrun", argv)
    finally:
        skip_final_collections()


if __name__ == "__main__":
    sys.exit(main())
