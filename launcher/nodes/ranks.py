"""Automatic node ranks, when ``--node_rank`` is left out: the node whose own address is
``--master_addr`` is node 0; every other asks node 0's scheduler for a rank, with a node id
that survives a restart of its tftrun so that a returning node gets its old rank
(docs/multi-node.md#automatic-node-ranks)."""

from __future__ import annotations

import socket
import sys
import time

from launcher.config import LaunchConfig, with_node_rank
from launcher.errors import ConfigError
from recovery.control.rpc import Op, SchedulerLink, SchedulerUnavailable

__all__ = ["place_node", "take_node_rank", "default_node_id", "owns_address", "REPLY_TIMEOUT"]

REPLY_TIMEOUT = 2.0
"""Seconds one request waits for its answer; it is asked again until --cluster_time_out."""


def _addresses(host: str) -> set[str]:
    """The IP addresses ``host`` resolves to (none when it does not)."""
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return set()


def owns_address(master_addr: str, node_addr: str) -> bool:
    """Whether a node whose own address is ``node_addr`` is ``master_addr``'s host."""
    return bool(_addresses(master_addr) & _addresses(node_addr))


def default_node_id(node_addr: str) -> str:
    """A node's id when ``--node_id`` is left out: host name and node address, the same when
    its tftrun starts again on the same machine."""
    return f"{socket.gethostname()}/{node_addr}"


def place_node(config: LaunchConfig) -> LaunchConfig:
    """``config`` with node rank 0 when it is left out and this node is node 0; otherwise
    unchanged, for :func:`take_node_rank`. ``config.node_addr`` must be known."""
    if config.node_rank is None and (not config.multi_node
                                     or owns_address(config.master_addr, config.local_addr)):
        return with_node_rank(config, 0)
    return config


def take_node_rank(config: LaunchConfig) -> LaunchConfig:
    """``config`` with the rank node 0's scheduler gives this node, waiting up to
    ``--cluster_time_out``; ConfigError when it refuses or does not answer."""
    if config.node_rank is not None:
        return config
    node_id = config.node_id or default_node_id(config.local_addr)
    link = SchedulerLink(config.master_addr, config.master_port, config.job_token, REPLY_TIMEOUT,
                         run_id=config.run_id, epoch=config.epoch)
    where = f"node 0's scheduler at {link.where}"
    try:
        reply = link.call_until(Op.NODE_RANK, time.monotonic() + config.cluster_time_out,
                                node_id=node_id, nproc=config.nproc)
    except SchedulerUnavailable:
        raise ConfigError(f"{where} gave this node ({node_id}) no node rank within "
                          f"--cluster_time_out={config.cluster_time_out:g}s") from None
    finally:
        link.close()
    if not reply.get("ok"):
        raise ConfigError(f"{where} gives this node ({node_id}) no node rank: "
                          f"{reply.get('message')}")
    rank = reply["node_rank"]
    print(f"tftrun: node rank {rank} from {where} (node id {node_id})", file=sys.stderr)
    return with_node_rank(config, rank)
