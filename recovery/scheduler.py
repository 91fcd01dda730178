"""The scheduler process: hosts the cluster's c10d ``TCPStore`` at MS_SCHED_HOST:MS_SCHED_PORT.

Started by tftrun as ``python -m recovery.scheduler`` (or by a training script's
``recovery.init()`` under ``MS_ROLE=MS_SCHED``). When tftrun starts it, the listening
socket is inherited (``TFT_STORE_FD``), so that a relaunched scheduler serves on the same
port at once, and no other process can take the port in between.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from datetime import timedelta

from recovery import env as envnames
from recovery.env import WorkerEnv

__all__ = ["host_store", "main"]

logger = logging.getLogger(__name__)


def host_store(host: str, port: int, listen_fd: int | None) -> "object":
    """Start the store's server in this process and return it."""
    import torch.distributed as dist

    return dist.TCPStore(
        host, port, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=30), master_listen_fd=listen_fd,
    )


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s scheduler %(message)s")
    worker_env = WorkerEnv.from_env()
    fd_text = os.environ.get(envnames.TFT_STORE_FD)
    store = host_store(worker_env.sched_host, worker_env.sched_port,
                       int(fd_text) if fd_text else None)
    logger.info("serving the cluster store on %s:%d", worker_env.sched_host, store.port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
