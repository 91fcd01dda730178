"""Where each launch's ``env://`` workers meet: the scheduler's store, a fresh store this
node serves, or (on another node) the one node 0 announces; and, on another node, where
``tftctl`` finds node 0's scheduler."""

from __future__ import annotations

import os
import time
from functools import partial

from launcher.config import LaunchConfig
from launcher.nodes.link import NodeLink
from launcher.nodes.rendezvous import RendezvousStore
from recovery.control.files import Endpoint

__all__ = ["MeetingPlace", "point_at_remote_scheduler"]


class MeetingPlace:
    """Chooses, for each launch of the workers, the store their rendezvous uses; ``nodes`` is
    node 0's cluster store (only with other nodes), ``hosts_scheduler`` whether this node
    started the scheduler, whose store serves the first launch on one node."""

    def __init__(self, config: LaunchConfig, hosts_scheduler: bool,
                 nodes: NodeLink | None) -> None:
        self._config = config
        self._hosts_scheduler = hosts_scheduler
        self._nodes = nodes
        self._store = RendezvousStore(config.local_addr)
        self._publisher = (NodeLink(config.master_addr, config.master_port, config.job_token, config.run_id,
                                    config.epoch) if nodes is not None and config.hosts_scheduler else None)
        """Node 0's announcer, one for the job: the store's thread uses it while the loop uses ``nodes``."""

    def _at_scheduler(self, restart_count: int) -> bool:
        """Whether this launch's workers meet at the scheduler's store: only the first launch
        on one node, as that store is new and this process need not import torch to host one."""
        return self._hosts_scheduler and self._nodes is None and restart_count == 0

    def choose(self, restart_count: int) -> tuple[str, int]:
        """Where launch ``restart_count`` meets (before its workers are started)."""
        config = self._config
        if self._at_scheduler(restart_count):
            # Where the scheduler's store listens, as named: torchrun's MASTER_ADDR is the
            # --master_addr given (a host name stays a name, Slurm's included).
            return config.master_addr, config.master_port
        if config.hosts_scheduler:
            return config.local_addr, self._store.open()
        assert self._nodes is not None
        where = self._nodes.rendezvous(restart_count, config.cluster_time_out)
        if where is None:
            raise RuntimeError(f"node 0 did not say where the workers of restart {restart_count} "
                               f"meet within --cluster_time_out={config.cluster_time_out:g}s")
        return where

    def serve(self, restart_count: int, where: tuple[str, int]) -> None:
        """Serve the store chosen, once the workers were started (importing torch here then
        overlaps with theirs); node 0 with other nodes then tells them where it is."""
        if not self._config.hosts_scheduler or self._at_scheduler(restart_count):
            return
        self._store.serve(None if self._publisher is None
                          else partial(self._publisher.publish_rendezvous, restart_count, *where))

    def close(self) -> None:
        self._store.close()  # joins the store's thread: the announcer is idle then
        if self._publisher is not None:
            self._publisher.close()


def point_at_remote_scheduler(config: LaunchConfig) -> Endpoint | None:
    """On a node without the scheduler: say in the log dir where it serves (on node 0),
    with this tftrun's pid, so that ``tftctl status`` works on this node too."""
    if config.hosts_scheduler:
        return None
    endpoint = Endpoint(config.master_addr, config.master_port, os.getpid(), config.run_id,
                        time.time())
    endpoint.write(config.log_dir)
    return endpoint
