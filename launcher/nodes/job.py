"""Which job, and which launch of it, this node serves: node 0 decides, drawing a new epoch
each launch so that nothing signed earlier verifies; other nodes trust the scheduler's signed
answer (recovery/control/job_proof.py) over ``tft/job``, which may be replayed."""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from launcher.config import LaunchConfig
from launcher.errors import ConfigError
from launcher.nodes.link import NodeLink, job_still_waited_for, save_job, saved_job
from launcher.nodes.ranks import REPLY_TIMEOUT, owns_address, take_node_rank
from recovery.control.job_proof import JobProof, ask_job
from recovery.control.nodes import JOB_KEY, BadValue, JobIdentity, parse_address
from recovery.control.rpc import SchedulerUnavailable

__all__ = ["join_job", "return_to_job", "keep_job", "proven_job", "served_at"]


def join_job(config: LaunchConfig) -> LaunchConfig:
    """A node other than node 0 waits for node 0's scheduler and takes its job's run id,
    lineage and epoch, and its node rank when left out."""
    posted = NodeLink(config.master_addr, config.master_port,
                      config.job_token).wait_for_job(config.cluster_time_out)
    job = proven_job(config, posted)
    if job.worker_num != config.worker_num:
        raise ConfigError(f"--worker_num={config.worker_num}, but node 0 runs "
                          f"{job.worker_num} workers")
    if config.nnodes is not None and job.node_num not in (0, config.nnodes):
        raise ConfigError(f"--nnodes={config.nnodes}, but node 0 runs {job.node_num} nodes")
    return take_node_rank(replace(config, run_id=job.run_id, lineage=job.lineage,
                                  epoch=job.epoch))


def proven_job(config: LaunchConfig, posted: JobIdentity) -> JobIdentity:
    """The job node 0's scheduler answers for at ``--master_addr``; ``posted`` (the
    ``tft/job`` this node found) is refused on stderr when it is another."""
    where = f"{config.master_addr}:{config.master_port}"
    deadline = time.monotonic() + config.cluster_time_out
    while True:
        try:
            proof = ask_job(config.master_addr, config.master_port, config.job_token,
                            REPLY_TIMEOUT, deadline)
        except SchedulerUnavailable:
            raise ConfigError(f"node 0's scheduler at {where} did not say which job it serves "
                              f"within --cluster_time_out={config.cluster_time_out:g}s") from None
        except BadValue as err:
            raise ConfigError(f"node 0's scheduler at {where}: {err}") from None
        if served_at(proof, config.master_addr, config.master_port):
            break
        print(f"tftrun: refused an answer to which job node 0's scheduler at {where} serves: "
              f"it was signed by the scheduler at {proof.address} (relayed to another job's)",
              file=sys.stderr)
    if proof.job != posted:
        print(f"tftrun: refused the {JOB_KEY} in node 0's store at {where} (job "
              f"{posted.run_id}, launch {posted.epoch[:8] or '-'}): node 0's scheduler serves "
              f"job {proof.job.run_id}, launch {proof.job.epoch[:8] or '-'} (a value replayed "
              f"from another job that shares the token, or from an earlier launch)",
              file=sys.stderr)
    return proof.job


def served_at(proof: JobProof, host: str, port: int) -> bool:
    """Whether ``proof`` was signed by the scheduler that serves at ``host:port``."""
    try:
        signed_host, signed_port = parse_address(proof.address)
    except BadValue:
        return False
    return signed_port == port and owns_address(host, signed_host)


def return_to_job(config: LaunchConfig) -> LaunchConfig:
    """Node 0 of many, started with its usual command, returns to the job the other nodes
    still wait for (as with ``--is_recover=1``)."""
    job = job_still_waited_for(config.recovery_path, config.node_time_out, time.time())
    if job is None:
        return config
    print(f"tftrun: node 0 returns to job {job.run_id}: its scheduler's state in "
          f"{config.recovery_path} is not finished and younger than --node_time_out="
          f"{config.node_time_out:g}s", file=sys.stderr)
    return replace(config, is_recover=True)


def keep_job(config: LaunchConfig) -> LaunchConfig:
    """Node 0 of many: a resumed launch (``--is_recover=1``) serves the job it kept, with
    that launch's epoch only while the other nodes still wait (their workers sign with
    it). Any launch saves the job it serves."""
    kept = saved_job(config.recovery_path) if config.is_recover else None
    if kept is not None and kept.lineage == config.lineage and kept.worker_num == config.worker_num:
        config = replace(config, run_id=kept.run_id)
        if job_still_waited_for(config.recovery_path, config.node_time_out, time.time()) == kept:
            config = replace(config, epoch=kept.epoch)
    save_job(config.recovery_path, JobIdentity(config.run_id, config.lineage, config.worker_num,
                                               config.nnodes or 0, config.epoch))
    return config
