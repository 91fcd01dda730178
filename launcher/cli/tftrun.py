"""``tftrun [OPTIONS] SCRIPT [SCRIPT_ARGS...]``: msrun's options, torchrun's aliases.

Every option takes both spellings (``--worker_num`` and ``--worker-num``) and both forms
(``--opt=value`` and ``--opt value``). Everything after SCRIPT belongs to the script.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from filelock import FileLock, Timeout

from launcher.cli.common import finite_float, new_app, run_app
from launcher.nodes.cluster_env import fill_from_cluster
from launcher.config import (
    DEFAULT_PROGRESS_INTERVAL, LaunchConfig, bind_listener, check_own_folder,
)
from launcher.errors import ConfigError
from launcher.view.logs import archive_previous_run
from launcher.nodes.link import (
    NodeLink, job_still_waited_for, local_address_towards, save_job, saved_job,
)
from launcher.view.render import make_view
from launcher.supervisor.loop import Supervisor
from recovery import env as names
from recovery.control.signing import WeakToken, checked_strength
from recovery.env import DEFAULT_RECOVERY_PATH
from recovery.control.nodes import JobIdentity
from recovery.events import EVENTS_FILE, EventLog
from recovery.ckpt.layout import previous_dir
from recovery.ckpt.lineage import LineageError, join_lineage, open_lineage
from recovery.timeouts import (
    DEFAULT_CLUSTER_TIME_OUT, DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_PROGRESS_TIMEOUT,
    DEFAULT_REJOIN_COOLDOWN,
)

__all__ = ["app", "main"]

LOCK_FILE = "tftrun.lock"

app = new_app("tftrun", "Launch a fault-tolerant distributed PyTorch job on this node.")


def _opt(name: str, help_text: str, **settings: Any) -> typer.models.OptionInfo:
    """An option under both spellings: ``--name_with_underscores`` and ``--name-with-dashes``."""
    spellings = dict.fromkeys((f"--{name}", f"--{name.replace('_', '-')}"))
    return typer.Option(*spellings, help=help_text, **settings)


def _float_opt(name: str, help_text: str) -> typer.models.OptionInfo:
    """A float option (see :func:`_opt`) that refuses NaN and the infinities."""
    return _opt(name, help_text, parser=finite_float)


def parse_bool(value: str, option: str) -> bool:
    """msrun's ``--join=True``/``False`` spelling, plus 1/0/yes/no."""
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{option} takes True or False, got {value!r}")


@app.command(context_settings={"allow_interspersed_args": False})
def launch(
    script: Annotated[Path, typer.Argument(help="The training script (run with this Python).",
                                           show_default=False)],
    script_args: Annotated[list[str] | None, typer.Argument(
        help="Arguments passed to the script unchanged.", show_default=False)] = None,
    worker_num: Annotated[int | None, _opt(
        "worker_num", "Workers in the whole job (all nodes). [default: 8, or nnodes x "
        "nproc_per_node]")] = None,
    local_worker_num: Annotated[int | None, _opt(
        "local_worker_num", "Workers on this node. [default: worker_num]")] = None,
    nproc_per_node: Annotated[int | None, _opt(
        "nproc_per_node", "torchrun's name for --local_worker_num.")] = None,
    nnodes: Annotated[int | None, _opt(
        "nnodes", "torchrun's node count: worker_num defaults to nnodes x nproc_per_node. "
        "[default: from Slurm]")] = None,
    master_addr: Annotated[str | None, _opt(
        "master_addr", "Address of the scheduler (node 0). [default: from Slurm or "
        "Kubernetes, else 127.0.0.1]")] = None,
    master_port: Annotated[int, _opt(
        "master_port", "Port of the scheduler's store; must be free on node 0.")] = 8118,
    node_rank: Annotated[int | None, _opt(
        "node_rank", "This node's index; its ranks are node_rank x local_worker_num + i. "
        "[default: from Slurm or Kubernetes, else 0]")] = None,
    node_addr: Annotated[str | None, _opt(
        "node_addr", "This node's address, where the other nodes reach its workers and "
        "stores (torchrun's --local_addr). [default: the address of the interface that "
        "reaches --master_addr]")] = None,
    log_dir: Annotated[Path, _opt(
        "log_dir", "Folder for worker_<rank>.log, scheduler.log and events.jsonl; an "
        "earlier run's files there are moved to previous/<n>/.")] = Path("logs"),
    join: Annotated[str, _opt(
        "join", "True: also stream every worker's output here, prefixed with its rank.")
    ] = "False",
    cluster_time_out: Annotated[float, _float_opt(
        "cluster_time_out", "Seconds to wait for the cluster to form.")] = DEFAULT_CLUSTER_TIME_OUT,
    node_time_out: Annotated[float | None, _float_opt(
        "node_time_out", "Seconds a lost node (its ranks missing, or node 0's scheduler "
        "unreachable) may take to come back before the job ends on every node. "
        "[default: cluster_time_out]")] = None,
    max_restarts: Annotated[int, _opt(
        "max_restarts", "Restarts allowed after worker failures before the job stops.")] = 3,
    rejoin_cooldown: Annotated[float, _float_opt(
        "rejoin_cooldown", "Seconds a dead worker's node id may not re-register "
        "(msrun's 30 s).")] = DEFAULT_REJOIN_COOLDOWN,
    monitor_interval: Annotated[float, _float_opt(
        "monitor_interval", "Seconds between checks of the workers (deaths are seen at "
        "once regardless).")] = 0.1,
    heartbeat_timeout: Annotated[float, _float_opt(
        "heartbeat_timeout", "Seconds without a heartbeat before a worker is declared dead.")
    ] = DEFAULT_HEARTBEAT_TIMEOUT,
    progress_timeout: Annotated[float, _float_opt(
        "progress_timeout", "Seconds a worker may stay behind another worker's step of its "
        "generation before it is declared hung.")] = DEFAULT_PROGRESS_TIMEOUT,
    grace_period: Annotated[float, _float_opt(
        "grace_period", "Seconds between SIGTERM and SIGKILL when stopping processes.")] = 10.0,
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
    progress_interval: Annotated[float, _float_opt(
        "progress_interval", "Off a terminal (CI, a pipe): seconds between two progress "
        "lines (each rank's step and steps/s, the ETA, a recovery under way); 0: none.")
    ] = DEFAULT_PROGRESS_INTERVAL,
) -> int:
    """Launch SCRIPT as WORKER_NUM data-parallel workers and keep the job alive."""
    node_rank, nnodes, master_addr = fill_from_cluster(node_rank, nnodes, master_addr)
    local = local_worker_num if local_worker_num is not None else nproc_per_node
    if worker_num is None:
        worker_num = nnodes * local if nnodes is not None and local is not None else 8
    config = LaunchConfig(
        script=script, script_args=tuple(script_args or ()), worker_num=worker_num,
        local_worker_num=local, master_addr=master_addr, master_port=master_port,
        node_rank=node_rank, nnodes=nnodes, log_dir=log_dir, join=parse_bool(join, "--join"),
        cluster_time_out=cluster_time_out, max_restarts=max_restarts,
        node_time_out=cluster_time_out if node_time_out is None else node_time_out,
        rejoin_cooldown=rejoin_cooldown, monitor_interval=monitor_interval,
        heartbeat_timeout=heartbeat_timeout, progress_timeout=progress_timeout,
        grace_period=grace_period, restart_policy=restart_policy, is_recover=parse_bool(is_recover, "--is_recover"),
        recovery_path=recovery_path, enable_tft=enable_tft, warm_spare=warm_spare,
        progress_interval=progress_interval,
    )
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
    config = replace(config, node_addr=node_addr or local_address_towards(
        config.master_addr, config.master_port))
    with ExitStack() as held:
        _hold_lock(held, config.log_dir, f"another tftrun job is running with --log_dir {config.log_dir}")
        _hold_lock(held, _writable(config.recovery_path),
                   f"another tftrun job is using --recovery_path {config.recovery_path}")
        store_socket = (bind_listener(config.master_addr, config.master_port)
                        if config.hosts_scheduler else None)
        if store_socket is not None:
            held.callback(store_socket.close)
        if not config.hosts_scheduler:
            config = _join_job(config)
        elif config.multi_node and not config.is_recover:
            config = _return_to_job(config)
        config = replace(config, lineage=_open_lineage(config))
        if config.hosts_scheduler and config.multi_node:
            config = _keep_job(config)
        archive_previous_run(config.log_dir)
        view = make_view(config.log_dir / EVENTS_FILE, config.progress_interval, config.node_title)
        supervisor = Supervisor(config, store_socket, view, EventLog(config.log_dir, config.node_rank))
        return supervisor.run()


def _hold_lock(held: ExitStack, directory: Path, busy: str) -> None:
    """Hold ``directory``'s tftrun lock until ``held`` closes; ConfigError(busy) if taken."""
    lock = FileLock(str(directory / LOCK_FILE))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise ConfigError(busy) from None
    held.callback(lock.release)


def _writable(recovery_path: Path) -> Path:
    try:
        recovery_path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--recovery_path {recovery_path} is not writable: {err.strerror}") from None
    check_own_folder(recovery_path, "--recovery_path")
    return recovery_path


def _join_job(config: LaunchConfig) -> LaunchConfig:
    """A node other than node 0 waits for node 0's scheduler and takes its job identity:
    one run id and one lineage for every node (the token, every node is given)."""
    job = NodeLink(config.master_addr, config.master_port,
                   config.job_token).wait_for_job(config.cluster_time_out)
    if job.worker_num != config.worker_num:
        raise ConfigError(f"--worker_num={config.worker_num}, but node 0 runs "
                          f"{job.worker_num} workers")
    if config.nnodes is not None and job.node_num not in (0, config.nnodes):
        raise ConfigError(f"--nnodes={config.nnodes}, but node 0 runs {job.node_num} nodes")
    return replace(config, run_id=job.run_id, lineage=job.lineage)


def _return_to_job(config: LaunchConfig) -> LaunchConfig:
    """Node 0 of many, started with its usual command: it returns to the job the other
    nodes still wait for (as with ``--is_recover=1``), else it starts a new one."""
    job = job_still_waited_for(config.recovery_path, config.node_time_out, time.time())
    if job is None:
        return config
    print(f"tftrun: node 0 returns to job {job.run_id}: its scheduler's state in "
          f"{config.recovery_path} is not finished and younger than --node_time_out="
          f"{config.node_time_out:g}s", file=sys.stderr)
    return replace(config, is_recover=True)


def _keep_job(config: LaunchConfig) -> LaunchConfig:
    """Node 0 of many: a resumed launch (``--is_recover=1``) serves the job it kept, so that
    its scheduler reloads the job's state and the other nodes' workers, which kept
    running, are still its members; any launch keeps the job it serves."""
    kept = saved_job(config.recovery_path) if config.is_recover else None
    if kept is not None and kept.lineage == config.lineage and kept.worker_num == config.worker_num:
        config = replace(config, run_id=kept.run_id)
    save_job(config.recovery_path, JobIdentity(config.run_id, config.lineage,
                                               config.worker_num, config.nnodes or 0))
    return config


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
    return run_app(app, "tftrun", argv)


if __name__ == "__main__":
    sys.exit(main())
