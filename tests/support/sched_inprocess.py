"""A real scheduler (its c10d TCPStore included) serving in a thread of the test process."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from recovery.control.scheduler import Scheduler
from recovery.control.scheduler_config import SchedulerConfig
from recovery.control.signing import BadSignature, Kind, job_key, unseal
from recovery.env import DEFAULT_RUN_ID
from recovery.timeouts import Timeouts
from support import signed_request, wait_for_event

TOKEN = "job-token"


def signed(op: str, token: str = TOKEN, rid: str | None = None, **fields: Any) -> bytes:
    """A request as a client of the job whose token is ``token`` sends it."""
    return signed_request(token, op, rid, **fields)


def answer(reply: str | bytes, token: str = TOKEN) -> dict[str, Any]:
    """The fields of a reply's body, and ``signed``: whether it verifies with ``token``."""
    try:
        return {**json.loads(unseal(job_key(token, DEFAULT_RUN_ID, ""), Kind.REPLY, reply).body), "signed": True}
    except BadSignature as err:
        assert err.header is not None, err
        return {**json.loads(err.header.body), "signed": False}


def scheduler_config(tmp_path: Path, port: int, worker_num: int = 2) -> SchedulerConfig:
    return SchedulerConfig(
        host="127.0.0.1", port=port, listen_fd=None, worker_num=worker_num, token=TOKEN,
        run_id=DEFAULT_RUN_ID, log_dir=str(tmp_path / "logs"), recovery_path=str(tmp_path / "recovery"),
        timeouts=Timeouts(rejoin_cooldown=30.0, cluster_time_out=60.0))


@contextmanager
def running_scheduler(tmp_path: Path, port: int, worker_num: int = 2) -> Iterator[Scheduler]:
    scheduler = Scheduler(scheduler_config(tmp_path, port, worker_num))
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        wait_for_event(tmp_path / "logs", 30, "the scheduler serving", event="scheduler_start")
        yield scheduler
    finally:
        scheduler.request_stop("the test is over")
        thread.join(10)


def scheduler(tmp_path: Path) -> Scheduler:
    """A scheduler whose requests are handled in this thread, with an in-memory c10d
    store where it moves its news counter (an injection is news)."""
    from torch.distributed import HashStore

    sched = Scheduler(SchedulerConfig(
        host="127.0.0.1", port=1, listen_fd=None, worker_num=2, token=TOKEN, run_id=DEFAULT_RUN_ID,
        log_dir=str(tmp_path / "logs"), recovery_path=str(tmp_path / "recovery"),
        timeouts=Timeouts()))
    sched._client = HashStore()
    return sched


def ask(sched: Scheduler, op: str, token: str = TOKEN, **fields: Any) -> dict[str, Any]:
    """One request through the scheduler's loop body: decide, persist, then reply."""
    _rid, reply = sched._handle(signed(op, token, **fields))
    sched._after_request()
    assert reply is not None
    return answer(reply)


def reloaded(tmp_path: Path) -> Scheduler:
    """A scheduler relaunched after a kill -9: it takes over the persisted state."""
    sched = scheduler(tmp_path)
    assert sched._reload()
    return sched
