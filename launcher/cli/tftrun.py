"""``tftrun [OPTIONS] SCRIPT [SCRIPT_ARGS...]``: msrun's options, torchrun's aliases.

Every option takes both spellings (``--worker_num`` and ``--worker-num``) and both forms
(``--opt=value`` and ``--opt value``). Everything after SCRIPT belongs to the script.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer
from filelock import FileLock, Timeout

from launcher.cli.common import finite_float, new_app, run_app
from launcher.cli.compat import (
    RDZV_BACKENDS,
    Entry,
    console_ranks,
    parse_endpoint,
    parse_nnodes,
    parse_rdzv_conf,
    parse_signals,
    rdzv_conf_note,
    resolve_nproc,
    strip_python,
)
from launcher.config import (
    AUTO_NODE_RANK,
    DEFAULT_MASTER_PORT,
    DEFAULT_PROGRESS_INTERVAL,
    DEFAULT_SIGNALS,
    LaunchConfig,
    bind_listener,
    with_own_folders,
)
from launcher.errors import ConfigError
from launcher.nodes.cluster_env import DEFAULT_MASTER_ADDR, fill_from_cluster
from launcher.nodes.job import join_job, keep_job, return_to_job
from launcher.nodes.link import local_address_towards
from launcher.nodes.ranks import place_node
from launcher.supervisor.loop import Supervisor
from launcher.view.logs import archive_previous_run
from launcher.view.render import make_view
from recovery import env as names
from recovery.ckpt.layout import previous_dir
from recovery.ckpt.lineage import LineageError, join_lineage, open_lineage
from recovery.control.node_range import DEFAULT_LAST_CALL
from recovery.control.signing import WeakToken, checked_strength
from recovery.env import DEFAULT_RECOVERY_PATH
from recovery.events import EVENTS_FILE, EventLog
from recovery.quick_exit import skip_final_collections
from recovery.timeouts import (
    DEFAULT_CLUSTER_TIME_OUT,
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_PROGRESS_TIMEOUT,
    DEFAULT_REJOIN_COOLDOWN,
)

__all__ = ["app", "main", "build_config", "config_from_argv"]

LOCK_FILE = "tftrun.lock"
TORCHRUN_ONLY = ("standalone", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
                 "rdzv_conf", "module", "no_python", "run_path", "redirects", "tee",
                 "local_ranks_filter", "local_addr")
"""Options msrun does not have: with any of them (or --nnodes) the command line is
torchrun's, and --worker_num defaults to torchrun's nnodes x nproc_per_node (1 x 1 when
left out), not msrun's 8."""
START_METHODS = ("spawn", "fork", "forkserver")
"""torchrun's choices; tftrun starts every worker as a fresh process whichever is given."""

app = new_app("tftrun", "Launch a fault-tolerant distributed PyTorch job on this node.")


def _opt(name: str, help_text: str, **settings: Any) -> typer.models.OptionInfo:
    """An option under both spellings: ``--name_with_underscores`` and ``--name-with-dashes``."""
    spellings = dict.fromkeys((f"--{name}", f"--{name.replace('_', '-')}"))
    return typer.Option(*spellings, help=help_text, **settings)


def _pet_opt(name: str, help_text: str, short: str | None = None,
             **settings: Any) -> typer.models.OptionInfo:
    """One of torchrun's options (see :func:`_opt`): its default is ``PET_<NAME>`` when set,
    as torchrun reads it (Kubeflow's PyTorchJob passes them)."""
    spellings = dict.fromkeys((*(() if short is None else (short,)), f"--{name}",
                               f"--{name.replace('_', '-')}"))
    return typer.Option(*spellings, help=help_text, envvar=names.pet(name), **settings)


def _float_opt(name: str, help_text: str, pet: bool = False) -> typer.models.OptionInfo:
    """A float option (see :func:`_opt`) that refuses NaN and the infinities."""
    return (_pet_opt if pet else _opt)(name, help_text, parser=finite_float)


def parse_bool(value: str, option: str) -> bool:
    """msrun's ``--join=True``/``False`` spelling, plus 1/0/yes/no."""
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{option} takes True or False, got {value!r}")


def _version(value: bool) -> None:
    if value:
        from importlib import metadata  # only here: 15-50 ms of every tftrun's start

        try:
            version = metadata.version("tftrun")
        except metadata.PackageNotFoundError:
            version = "(not installed)"
        print(f"tftrun {version}")
        raise typer.Exit(0)


def _refuse(value: object, why: str) -> object:
    """A torchrun option tftrun has no meaning for: one line, exit 2, saying what instead."""
    if value:
        raise ConfigError(why)
    return value


@app.command(context_settings={"allow_interspersed_args": False,
                               "help_option_names": ["-h", "--help"]})
def launch(
    script: Annotated[Path, typer.Argument(
        help="The training script (run with this Python), a module with -m, or an executable "
        "with --no_python. msrun's leading 'python' is dropped.", show_default=False)],
    script_args: Annotated[list[str] | None, typer.Argument(
        help="Arguments passed to the script unchanged.", show_default=False)] = None,
    worker_num: Annotated[int | None, _opt(
        "worker_num", "Workers in the whole job (all nodes). [default: nnodes x "
        "nproc_per_node when either is given (torchrun), else 8 (msrun)]")] = None,
    local_worker_num: Annotated[int | None, _opt(
        "local_worker_num", "Workers on this node. [default: worker_num]")] = None,
    min_worker_num: Annotated[int | None, _opt(
        "min_worker_num", "The fewest workers the job trains on while ranks are missing: "
        "below worker_num, the survivors of a death train on at once, with the same global "
        "batch, for a script that uses recovery; equal to worker_num, they wait for the "
        "dead rank, and the run ends bitwise equal to a fault-free one (docs/elastic.md). "
        "[default: 1; worker_num with --nnodes=MIN:MAX]")] = None,
    batch_policy: Annotated[str, _opt(
        "batch_policy", "What a step trains while ranks are missing (--min_worker_num): "
        "'constant' the same global batch (the survivors compute the lost ranks' share), "
        "'shrink' one micro-batch per live rank (torchft's). Sets TFT_BATCH_POLICY for the "
        "workers (docs/elastic.md).")] = "constant",
    nproc_per_node: Annotated[str | None, _pet_opt(
        "nproc_per_node", "torchrun's workers on this node: a count, or auto, cpu, gpu, xpu "
        "(one per core or device). Without --nnodes: one node.")] = None,
    nnodes: Annotated[str | None, _pet_opt(
        "nnodes", "torchrun's node count N, or its elastic range MIN:MAX (a plain script's "
        "workers all restart with the new WORLD_SIZE when nodes are lost or join): "
        "worker_num defaults to nnodes (MAX) x nproc_per_node. [default: from Slurm, else 1 "
        "with --nproc_per_node]")] = None,
    master_addr: Annotated[str | None, _pet_opt(
        "master_addr", "Address of the scheduler (node 0). [default: from Slurm or "
        "Kubernetes, else 127.0.0.1]")] = None,
    master_port: Annotated[int, _pet_opt(
        "master_port", "Port of the scheduler's store on node 0; 0: a free one (one node "
        "only), printed.")] = DEFAULT_MASTER_PORT,
    node_rank: Annotated[int | None, _pet_opt(
        "node_rank", "This node's index; its ranks are node_rank x local_worker_num + i. "
        "-1 (msrun's default) or left out: from Slurm or Kubernetes, else node 0 is the node "
        "whose address is --master_addr and the others get 1, 2, ... from node 0 in order "
        "of arrival.")] = None,
    node_id: Annotated[str | None, _opt(
        "node_id", "This node's identity for automatic node ranks: started again with it, "
        "the node gets the rank it had. [default: host name/node address]")] = None,
    node_addr: Annotated[str | None, _opt(
        "node_addr", "This node's address, where the other nodes reach its workers and "
        "stores. [default: the address of the interface that reaches --master_addr]")] = None,
    local_addr: Annotated[str | None, _pet_opt(
        "local_addr", "torchrun's name for --node_addr.")] = None,
    standalone: Annotated[bool, _pet_opt(
        "standalone", "torchrun's: one node, a free port (printed), a fresh run id; "
        "--rdzv_* values are ignored.")] = False,
    rdzv_backend: Annotated[str | None, _pet_opt(
        "rdzv_backend", "torchrun's; c10d or static: node 0's scheduler hosts the store "
        "either way.")] = None,
    rdzv_endpoint: Annotated[str | None, _pet_opt(
        "rdzv_endpoint", "torchrun's HOST[:PORT]: node 0's address and port (--master_addr, "
        "--master_port; port 29400 if left out).")] = None,
    rdzv_id: Annotated[str | None, _pet_opt(
        "rdzv_id", "torchrun's job id: the workers' TORCHELASTIC_RUN_ID.")] = None,
    rdzv_conf: Annotated[str | None, _pet_opt(
        "rdzv_conf", "torchrun's key=value,...: join_timeout sets --cluster_time_out, "
        "last_call_timeout how long an elastic --nnodes=MIN:MAX restart with MIN nodes waits "
        f"for more [default: {DEFAULT_LAST_CALL:g}]; other keys are ignored, with a "
        "warning.")] = None,
    module: Annotated[bool, _pet_opt(
        "module", "Run SCRIPT as a module, like python -m.", short="-m")] = False,
    no_python: Annotated[bool, _pet_opt(
        "no_python", "Run SCRIPT as an executable, not with Python (no warm spare).")] = False,
    run_path: Annotated[bool, _pet_opt(
        "run_path", "torchrun's runpy.run_path: SCRIPT runs as a Python file, as without "
        "it.")] = False,
    role: Annotated[str, _pet_opt("role", "The workers' ROLE_NAME.")] = "default",
    start_method: Annotated[str, _pet_opt(
        "start_method", "Accepted for torchrun's command lines: spawn, fork or forkserver. "
        "It chooses nothing: see --fork_server.")] = "spawn",
    log_dir: Annotated[Path, _pet_opt(
        "log_dir", "Folder for worker_<rank>.log, scheduler.log, fork_server.log and "
        "events.jsonl; an earlier run's files there are moved to previous/<n>/.")
    ] = Path("logs"),
    join: Annotated[str, _opt(
        "join", "True: also stream every worker's output here, prefixed with its rank.")
    ] = "False",
    redirects: Annotated[str | None, _pet_opt(
        "redirects", "torchrun's: 3 (or local_rank:3,...) keeps those ranks off the console; "
        "any of --redirects/--tee/--local_ranks_filter streams the other ranks' output here. "
        "Every rank's log file is written regardless.", short="-r")] = None,
    tee: Annotated[str | None, _pet_opt(
        "tee", "torchrun's: those ranks' output also on the console (see --redirects).",
        short="-t")] = None,
    local_ranks_filter: Annotated[str | None, _pet_opt(
        "local_ranks_filter", "torchrun's: only these local ranks (e.g. 0,1) on the console.")
    ] = None,
    cluster_time_out: Annotated[float | None, _float_opt(
        "cluster_time_out", "Seconds to wait for the cluster to form. "
        f"[default: {DEFAULT_CLUSTER_TIME_OUT:g}]")] = None,
    node_time_out: Annotated[float | None, _float_opt(
        "node_time_out", "Seconds a lost node (its ranks missing, or node 0's scheduler "
        "unreachable) may take to come back before the job ends on every node. "
        "[default: cluster_time_out]")] = None,
    max_restarts: Annotated[int, _pet_opt(
        "max_restarts", "Restarts allowed after worker failures before the job stops.")] = 3,
    rejoin_cooldown: Annotated[float, _float_opt(
        "rejoin_cooldown", "Seconds a dead worker's node id may not re-register "
        "(msrun's 30 s).")] = DEFAULT_REJOIN_COOLDOWN,
    rejoin_timeout: Annotated[float | None, _float_opt(
        "rejoin_timeout", "With --min_worker_num: seconds a dead worker may take to "
        "register again before it is retired for good and the job trains on without it. [default: "
        f"rejoin_cooldown + {DEFAULT_LAST_CALL:g} (torchrun's last call)]")] = None,
    monitor_interval: Annotated[float, _float_opt(
        "monitor_interval", "Seconds between checks of the workers (deaths are seen at "
        "once regardless).", pet=True)] = 0.1,
    heartbeat_timeout: Annotated[float, _float_opt(
        "heartbeat_timeout", "Seconds without a heartbeat before a worker is declared dead.")
    ] = DEFAULT_HEARTBEAT_TIMEOUT,
    progress_timeout: Annotated[float, _float_opt(
        "progress_timeout", "Seconds a worker may stay behind another worker's step of its "
        "generation before it is declared hung.")] = DEFAULT_PROGRESS_TIMEOUT,
    grace_period: Annotated[float, _float_opt(
        "grace_period", "Seconds between SIGTERM and SIGKILL when stopping processes.")] = 10.0,
    shutdown_timeout: Annotated[float | None, _float_opt(
        "shutdown_timeout", "torchrun's name for --grace_period.", pet=True)] = None,
    signals_to_handle: Annotated[str, _pet_opt(
        "signals_to_handle", "Signals to tftrun that stop the job in order (workers get them, "
        "exit 128+N), torchrun's comma-separated names.")] = ",".join(
            signal.Signals(number).name for number in DEFAULT_SIGNALS),
    restart_policy: Annotated[str, _opt(
        "restart_policy", "On a worker failure: 'all' restarts every worker (torchrun), "
        "'rank' relaunches only the dead ones (scripts using recovery), 'auto' picks per "
        "script.")] = "auto",
    is_recover: Annotated[str, _opt(
        "is_recover", "1: resume a dead job from its newest valid checkpoints (of its "
        "lineage).")] = "0",
    recovery_path: Annotated[Path, _opt(
        "recovery_path", "Folder for checkpoints and the scheduler's state; a fresh launch "
        "first moves an earlier job's state in it to previous/<n>/.")
    ] = Path(DEFAULT_RECOVERY_PATH),
    enable_tft: Annotated[str | None, _opt(
        "enable_tft", "Lose-nothing modes in msrun's MS_ENABLE_TFT syntax, e.g. "
        "'{TTP:1,UCE:1,ARF:1}' (the default); a mode left out is off.")] = None,
    warm_spare: Annotated[int | None, _opt(
        "warm_spare", "Spare processes kept ready on this node, torch imported, to take a "
        "relaunched rank's place without a cold start; 0: none. Default: 1 once a worker "
        "registers (its script uses recovery), unless --restart_policy=all.")] = None,
    fork_server: Annotated[str, _opt(
        "fork_server", "True: fork this node's workers, and their relaunches, from one "
        "warm Python that imported torch once (a Python script or -m module); False: start "
        "each as a fresh process.")] = "True",
    progress_interval: Annotated[float, _float_opt(
        "progress_interval", "Off a terminal (CI, a pipe): seconds between two progress "
        "lines (each rank's step and steps/s, the ETA, a recovery under way); 0: none.")
    ] = DEFAULT_PROGRESS_INTERVAL,
    event_log_handler: Annotated[str, _pet_opt(
        "event_log_handler", "Accepted for torchrun's command lines: tftrun's events go to "
        "<log_dir>/events.jsonl.")] = "null",
    logs_specs: Annotated[str | None, _opt("logs_specs", "Refused: see --log_dir.")] = None,
    numa_binding: Annotated[str | None, _opt("numa_binding", "Refused (not supported yet).")
    ] = None,
    duplicate_stdout_filters: Annotated[str | None, _pet_opt(
        "duplicate_stdout_filters", "Refused: grep <log_dir>/worker_*.log.")] = None,
    duplicate_stderr_filters: Annotated[str | None, _pet_opt(
        "duplicate_stderr_filters", "Refused: grep <log_dir>/worker_*.log.")] = None,
    virtual_local_rank: Annotated[bool, _pet_opt(
        "virtual_local_rank", "Refused: use LOCAL_RANK as the device index.")] = False,
    version: Annotated[bool, typer.Option(
        "--version", help="Print tftrun's version and exit.", callback=_version,
        is_eager=True)] = False,
) -> int:
    """Launch SCRIPT as WORKER_NUM data-parallel workers and keep the job alive."""
    return _run(build_config(dict(locals())))


def config_from_argv(argv: Sequence[str]) -> LaunchConfig:
    """The LaunchConfig a command line asks for, unchecked and nothing started (for tests)."""
    command = typer.main.get_command(app)
    with command.make_context("tftrun", list(argv)) as ctx:
        return build_config(dict(ctx.params))


def build_config(params: dict[str, Any]) -> LaunchConfig:
    """The options (msrun's, torchrun's, tftrun's) → what they mean, before any check."""
    p = SimpleNamespace(**params)
    _refuse_unsupported(p)
    entry = _entry(p)
    master_addr, master_port, nnodes, cluster_time_out, last_call = _rendezvous(p)
    torchrun_style = nnodes is not None or any(params[name] for name in TORCHRUN_ONLY)
    node_range = None if nnodes is None else parse_nnodes(nnodes)
    node_rank, node_count, master_addr = fill_from_cluster(
        None if p.node_rank == AUTO_NODE_RANK else p.node_rank,
        None if node_range is None else node_range[1], master_addr)
    worker_num, local = _sizes(p, node_count, torchrun_style)
    console = None
    if p.redirects is not None or p.tee is not None or p.local_ranks_filter:
        console = console_ranks(p.redirects, p.tee, p.local_ranks_filter, local or worker_num)
    config = LaunchConfig(
        script=Path(entry.target), script_args=entry.args, entry=entry.kind,
        worker_num=worker_num, local_worker_num=local, min_worker_num=p.min_worker_num,
        batch_policy=p.batch_policy,
        master_addr=master_addr,
        master_port=master_port, node_rank=node_rank, node_id=p.node_id or "", nnodes=node_count,
        min_nnodes=None if node_range is None else node_range[0], last_call=last_call,
        node_addr=p.node_addr or p.local_addr or "", log_dir=p.log_dir,
        join=parse_bool(p.join, "--join") or console is not None, console_ranks=console,
        cluster_time_out=cluster_time_out, max_restarts=p.max_restarts,
        node_time_out=cluster_time_out if p.node_time_out is None else p.node_time_out,
        rejoin_cooldown=p.rejoin_cooldown, rejoin_timeout=p.rejoin_timeout,
        monitor_interval=p.monitor_interval,
        heartbeat_timeout=p.heartbeat_timeout, progress_timeout=p.progress_timeout,
        grace_period=p.grace_period if p.shutdown_timeout is None else p.shutdown_timeout,
        restart_policy=p.restart_policy, is_recover=parse_bool(p.is_recover, "--is_recover"),
        recovery_path=p.recovery_path, enable_tft=p.enable_tft,
        warm_spare=p.warm_spare if entry.kind == "script" else 0,
        fork_server=parse_bool(p.fork_server, "--fork_server"),
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
    """torchrun's options without a meaning here: one line each, saying what instead."""
    _refuse(p.logs_specs, "--logs_specs: tftrun writes <log_dir>/worker_<rank>.log for each "
            "rank; it has no logs_specs plugins")
    _refuse(p.numa_binding, "--numa_binding is not supported; bind with numactl or "
            "taskset inside the worker, or leave it out")
    _refuse(p.duplicate_stdout_filters or p.duplicate_stderr_filters,
            "--duplicate_std*_filters are not supported; grep <log_dir>/worker_*.log instead")
    _refuse(p.virtual_local_rank, "--virtual_local_rank is not supported; use LOCAL_RANK as "
            "the device index (docs/gpu.md)")
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


def _rendezvous(p: SimpleNamespace) -> tuple[str | None, int, str | None, float, float]:
    """Node 0's address and port, the node count, ``--cluster_time_out`` and an elastic
    range's last call (``--rdzv_conf last_call_timeout``), from msrun's
    options, torchrun's ``--rdzv_*`` or ``--standalone`` (which overrides the address, the
    port and ``--rdzv_endpoint``, as torchrun's does; ``--rdzv_conf`` still counts)."""
    honoured, ignored = parse_rdzv_conf(p.rdzv_conf or "")
    master_addr, master_port, nnodes = p.master_addr, p.master_port, p.nnodes
    if p.standalone:
        if nnodes is not None and parse_nnodes(nnodes) != (1, 1):
            raise ConfigError(f"--standalone is one node, but --nnodes={nnodes}; leave one out")
        master_addr, master_port, nnodes = DEFAULT_MASTER_ADDR, 0, "1"
    elif p.rdzv_endpoint:
        master_addr, master_port = parse_endpoint(p.rdzv_endpoint)
    if ignored:
        print(rdzv_conf_note(ignored), file=sys.stderr)
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
    """``--worker_num`` and this node's worker count: msrun's 8 by default, torchrun's
    ``nnodes x nproc_per_node`` (1 x 1 by default) on a torchrun command line."""
    nproc = resolve_nproc(p.nproc_per_node) if p.nproc_per_node is not None else None
    local = p.local_worker_num if p.local_worker_num is not None else nproc
    worker_num = p.worker_num
    if worker_num is None:
        if node_count is not None and local is not None:
            worker_num = node_count * local
        else:
            worker_num = (node_count or 1) * (local or 1) if torchrun_style else 8
    if torchrun_style and local is None:
        local = worker_num // (node_count or 1)
    return worker_num, local


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
    if entry.kind != "script" and p.warm_spare:
        raise ConfigError("--warm_spare needs a Python script: a spare cannot run a module "
                          "(-m) or an executable (--no_python)")
    return entry


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
    # The route to --master_addr does not depend on the port (0 is not one to connect to).
    config = place_node(replace(config, node_addr=config.node_addr or local_address_towards(
        config.master_addr, config.master_port or DEFAULT_MASTER_PORT)))
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
        archive_previous_run(config.log_dir)
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
    """The job's lineage; a fresh launch first moves an earlier job's state aside.

    Only node 0 decides; another node joins node 0's lineage (``config.lineage``), in its
    own recovery path. See docs/checkpoints.md#lineage.
    """
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
