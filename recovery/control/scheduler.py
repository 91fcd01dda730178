"""The scheduler process: the cluster's single source of truth about membership.

Started by tftrun as ``python -m recovery.control.scheduler``, or by a training script's
``recovery.init()`` under ``MS_ROLE=MS_SCHED`` (msrun's dynamic-cluster style). It hosts
the cluster's c10d ``TCPStore`` at MS_SCHED_HOST:MS_SCHED_PORT; when tftrun starts it, the
listening socket is inherited (``TFT_STORE_FD``), so that a relaunched scheduler serves on
the same port at once and no other process can take the port in between.

One thread handles requests (recovery/control/rpc.py) one at a time and applies the rules of
recovery/control/membership.py; a ticker wakes it every :data:`TICK` seconds so that silence is
noticed too. Each request is checked first (recovery/control/requests.py): a malformed one is
answered ``bad_request`` and decides nothing. A retry of a request already carried out
is answered as the first attempt was (recovery/control/replies.py). After each request it writes
the decided events to ``events.jsonl``, publishes a newly formed generation, and persists
its state, so that a ``kill -9`` loses nothing the workers were told.

It ends on SIGTERM/SIGINT (tftrun's job end), and, when nothing supervises it (started by
hand), by itself: exit 0 once every worker finished, exit 1 when the cluster stays short
of workers for ``cluster_time_out``. Only such an orderly end marks the persisted state
finished; after a failure of its own, a relaunch takes the state over.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from recovery import env as names
from recovery.env import WorkerEnv
from recovery.events import EventLog
from recovery.control.inject import Injection, InjectionQueue, check, new_id
from recovery.control.claims import LastWords
from recovery.control.membership import (
    NO_GENERATION,
    Accepted,
    Identity,
    Membership,
    describe_incomplete,
)
from recovery.control.nodes import JOB_KEY, JobIdentity
from recovery.control.replies import KeptReplies, SentReplies
from recovery.control.requests import BadRequest, Request, parse_request
from recovery.control.rpc import REQUESTS, Op, open_client, ready_key, reply_key
from recovery.control.files import Endpoint, StateFile
from recovery.timeouts import Timeouts

__all__ = ["SchedulerConfig", "Scheduler", "host_store", "main", "EXIT_CLUSTER_TIMEOUT"]

logger = logging.getLogger(__name__)

TICK = 0.1
PERSIST_EVERY = 1.0
EXIT_CLUSTER_TIMEOUT = 1
_LOOP_TIMEOUT = timedelta(days=1)  # the ticker wakes the loop long before
_JOIN_TIMEOUT = 5.0
_WRONG_TOKEN = {"ok": False, "reason": "token", "message": "wrong job token"}
_KEPT = frozenset({Op.EXIT, Op.LEAVE, Op.INJECT, Op.LAST_WORDS})
"""The ops whose replies are kept for a retry: carried out twice, they would not do the
same (a second cooldown, a second injection, a claim granted but never learned)."""


def host_store(host: str, port: int, listen_fd: int | None) -> Any:
    """Start the store's server in this process and return it."""
    import torch.distributed as dist

    return dist.TCPStore(
        host, port, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=30), master_listen_fd=listen_fd,
    )


@dataclass(frozen=True)
class SchedulerConfig:
    """What the scheduler reads from its environment.

    ``supervised`` is true when tftrun started it (it passed the socket): then tftrun
    decides when the job ends, and the scheduler never exits by itself.
    """

    host: str
    port: int
    listen_fd: int | None
    worker_num: int
    token: str
    run_id: str
    log_dir: str | None
    recovery_path: str
    timeouts: Timeouts
    lineage: str = ""

    @property
    def supervised(self) -> bool:
        return self.listen_fd is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SchedulerConfig:
        env = os.environ if env is None else env
        worker = WorkerEnv.from_env(env)
        fd_text = env.get(names.TFT_STORE_FD, "")
        return cls(
            host=worker.sched_host,
            port=worker.sched_port,
            listen_fd=int(fd_text) if fd_text else None,
            worker_num=worker.world_size,
            token=worker.job_token,
            run_id=worker.run_id,
            log_dir=worker.log_dir,
            recovery_path=worker.recovery_path,
            timeouts=Timeouts.from_env(env),
            lineage=worker.lineage,
        )


class Scheduler:
    """Serves membership requests until the job ends; :meth:`run` returns the exit status."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.membership = Membership(config.worker_num, config.token, config.timeouts)
        self.events = EventLog(config.log_dir, node_rank=0)  # the scheduler runs on node 0
        self.injections = InjectionQueue()
        self.last_words = LastWords()
        self.replies = KeptReplies()
        self._sent = SentReplies()
        self._decided: list[tuple[str, dict[str, Any]]] = []
        self._changed = False
        self._state = StateFile(config.recovery_path)
        self._stopping = threading.Event()
        self._loop_exited = threading.Event()
        self._done = threading.Event()
        self._stop_reason: str | None = None
        self._failed = False
        self._exit = (0, "")
        self._client: Any = None
        self._published = NO_GENERATION
        self._saved = ""
        self._saved_at = 0.0
        self._overdue_reported = False
        self._started = time.time()
        self._handlers: dict[Op, Callable[[Request], dict[str, Any] | None]] = {
            Op.TICK: lambda _request: None,
            Op.STATUS: self._on_status,
            Op.REGISTER: self._on_register,
            Op.HEARTBEAT: self._on_heartbeat,
            Op.LEAVE: lambda request: self._on_exit(request, by="worker"),
            Op.EXIT: lambda request: self._on_exit(request, by="supervisor"),
            Op.COOLDOWN: self._on_cooldown,
            Op.VERDICTS: self._on_verdicts,
            Op.INJECT: self._on_inject,
            Op.LAST_WORDS: self._on_last_words,
        }

    # ----------------------------------------------------------------- lifecycle
    def run(self) -> int:
        cfg = self.config
        server = host_store(cfg.host, cfg.port, cfg.listen_fd)
        port = server.port
        self._client = open_client(cfg.host, port, _LOOP_TIMEOUT.total_seconds())
        reloaded = self._reload()
        # The other nodes wait for this key: the scheduler is up, and this is the job.
        self._client.set(JOB_KEY, JobIdentity(cfg.run_id, cfg.token, cfg.lineage,
                                              cfg.worker_num).to_json())
        endpoint = Endpoint(cfg.host, port, os.getpid(), cfg.run_id, self._started)
        if cfg.log_dir is not None:
            endpoint.write(cfg.log_dir)
        self.events.emit("scheduler_start", pid=os.getpid(), host=cfg.host, port=port,
                         run_id=cfg.run_id, worker_num=cfg.worker_num, reloaded=reloaded,
                         generation=self.membership.generation, supervised=cfg.supervised)
        logger.info("serving the cluster store on %s:%d for %d workers (%s)", cfg.host, port,
                    cfg.worker_num, "state reloaded" if reloaded else "new state")
        loop = threading.Thread(target=self._serve, name="tft-scheduler-loop", daemon=True)
        ticker = threading.Thread(target=self._tick, args=(cfg.host, port),
                                  name="tft-scheduler-ticker", daemon=True)
        loop.start()
        ticker.start()
        while not self._done.wait(0.2) and self._stop_reason is None:
            pass
        if self._stop_reason is not None:
            self._exit = (0, self._stop_reason)
        self._stopping.set()
        loop.join(_JOIN_TIMEOUT)  # the ticker wakes it until it has left
        ticker.join(_JOIN_TIMEOUT)
        if not loop.is_alive() and not self._failed:
            self._save(finished=True)
        if cfg.log_dir is not None:
            endpoint.remove(cfg.log_dir)
        code, reason = self._exit
        self.events.emit("scheduler_stop", pid=os.getpid(), reason=reason, exitcode=code)
        logger.info("stopping: %s", reason)
        return code

    def request_stop(self, reason: str) -> None:
        """End :meth:`run` soon (safe in a signal handler: it only records the reason)."""
        self._stop_reason = reason

    def _finish(self, code: int, reason: str) -> None:
        self._exit = (code, reason)
        self._done.set()

    def _reload(self) -> bool:
        """Take over the state a killed scheduler of this job left; True if it did."""
        data = self._state.load()
        if data is None:
            return False
        if data.get("finished") or data.get("run_id") != self.config.run_id:
            return False
        replies = KeptReplies()
        try:  # parsed before the membership is taken over: all or nothing
            injections = InjectionQueue.parse(data.get("injections", []))
            grants = LastWords.parse(data.get("last_words", {}))
            replies.load(data.get("replies", []))
            problem = self.membership.load(data.get("membership", {}))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            problem = f"it is malformed ({err!r})"
        if problem is not None:
            logger.warning("not reloading %s: %s", self._state.path, problem)
            return False
        self.injections.pending, self.last_words.grants = injections, grants
        self.replies = replies
        self._saved = json.dumps(self._snapshot(finished=False), sort_keys=True)
        return True

    def _tick(self, host: str, port: int) -> None:
        """Wake the loop every TICK, so that it notices silence, timeouts and a stop."""
        from torch.distributed import DistError

        client = open_client(host, port, TICK * 10)
        tick = json.dumps({"op": Op.TICK.value})
        while not self._loop_exited.wait(TICK):
            try:
                client.queue_push(REQUESTS, tick)
            except DistError:
                return

    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                rid, reply = self._handle(self._client.queue_pop(REQUESTS))
                self._after_request()
                # Only now, with the decision persisted: what a worker is told survives a
                # kill -9 of this process.
                if rid is not None and reply is not None:
                    self._client.set(reply_key(rid), json.dumps(reply))
                    self._sent.sent(rid)
                for expired in self._sent.expired():
                    self._client.delete_key(reply_key(expired))
        except Exception:
            # Not a request's fault (each is checked first): the store or the disk failed.
            logger.exception("the scheduler's loop failed")
            self._failed = True
            self._finish(1, "internal error (see scheduler.log)")
        finally:
            self._loop_exited.set()

    # ----------------------------------------------------------------- requests
    def _handle(self, raw: bytes) -> tuple[str | None, dict[str, Any] | None]:
        """Decide on one request: its id (to reply under, ``None``: no reply) and the reply.

        A retry of a request carried out already gets the same reply, and nothing is done
        again.
        """
        try:
            request = parse_request(raw)
        except BadRequest as err:
            logger.warning("bad request %r: %s", raw[:200], err)
            return err.rid, {"ok": False, "reason": "bad_request", "message": str(err)}
        rid = request.rid
        kept = None if rid is None else self.replies.get(rid)
        if kept is not None:
            return rid, kept
        reply = self._handlers[request.op](request)
        if rid is not None and reply is not None and reply["ok"] and request.op in _KEPT:
            self.replies.keep(rid, reply)
            self._changed = True  # persisted before the reply, as what it answers
        return rid, reply

    def _on_status(self, _request: Request) -> dict[str, Any]:
        cfg = self.config
        return {"ok": True, **self.membership.status(), "run_id": cfg.run_id,
                "pid": os.getpid(), "host": cfg.host, "started": self._started,
                "supervised": cfg.supervised,
                "rejoin_cooldown": cfg.timeouts.rejoin_cooldown,
                "heartbeat_timeout": cfg.timeouts.heartbeat_timeout,
                "progress_timeout": cfg.timeouts.progress_timeout,
                "cluster_time_out": cfg.timeouts.cluster_time_out}

    def _on_register(self, request: Request) -> dict[str, Any]:
        return self.membership.register(Identity.from_json(request.fields),
                                        request.token).to_json()

    def _on_heartbeat(self, request: Request) -> dict[str, Any]:
        """A beat; the reply hands the member the injections queued for its rank."""
        fields = request.fields
        answer = self.membership.heartbeat(Identity.from_json(fields), request.token,
                                           fields["step"], fields["phase"])
        reply = answer.to_json()
        if isinstance(answer, Accepted) and (taken := self.injections.take(answer.rank)):
            reply["inject"] = [i.to_json() for i in taken]
            self._changed = True  # handed out: persisted before the reply, never again
        return reply

    def _on_inject(self, request: Request) -> dict[str, Any]:
        if not self._authorized(request):
            return _WRONG_TOKEN
        fields = request.fields
        injection = Injection(new_id(), fields["rank"], fields["fault"], fields["at_step"])
        problem = check(injection.rank, injection.fault, injection.at_step,
                        self.config.worker_num)
        if problem is not None:
            return {"ok": False, "reason": "bad_injection", "message": problem}
        self.injections.add(injection)
        self._decide("inject", **injection.to_json(), via="scheduler")
        return {"ok": True, "id": injection.id}

    def _on_last_words(self, request: Request) -> dict[str, Any]:
        """A survivor of a fault claims the last-words save (recovery/control/claims.py)."""
        if not self._authorized(request):
            return _WRONG_TOKEN
        claim = request.fields
        save = self.last_words.claim(claim["generation"], claim["rank"], claim["step"],
                                     claim["consistent"])
        self._decide("last_words_claim", rank=claim["rank"], generation=claim["generation"],
                     step=claim["step"], consistent=claim["consistent"], granted=save,
                     reason=claim["reason"] or "")
        return {"ok": True, "save": save}

    def _decide(self, event: str, **fields: Any) -> None:
        """Record a decision of this module's own: persisted, then announced as ``event``."""
        self._decided.append((event, fields))
        self._changed = True

    def _authorized(self, request: Request) -> bool:
        if self.membership.token_ok(request.token):
            return True
        logger.warning("refused a %s request with a wrong job token", request.op.value)
        return False

    def _on_exit(self, request: Request, by: str) -> dict[str, Any]:
        if not self._authorized(request):
            return _WRONG_TOKEN
        ended = request.fields
        node_id, abnormal = ended["node_id"], ended["abnormal"]
        until = self.membership.report_exit(
            node_id, ended["pid"], ended["incarnation"], abnormal, ended["reason"] or "", by,
            finished=by == "worker" and not abnormal)
        return {"ok": True, "until": until, "left": self.membership.cooldown_left(node_id)}

    def _on_cooldown(self, request: Request) -> dict[str, Any]:
        if not self._authorized(request):
            return _WRONG_TOKEN
        node_id = request.fields["node_id"]
        return {"ok": True, "left": self.membership.cooldown_left(node_id),
                "until": self.membership.cooldowns.get(node_id, 0.0)}

    def _on_verdicts(self, request: Request) -> dict[str, Any]:
        if not self._authorized(request):
            return _WRONG_TOKEN
        return {"ok": True, "verdicts": {str(r): v for r, v in self.membership.verdicts().items()}}

    # ----------------------------------------------------------------- after each request
    def _after_request(self) -> None:
        """Apply the periodic rules, persist, then make the decisions known."""
        self.membership.check()
        decided = [*self.membership.drain_events(), *self._decided]
        self._save(finished=False, now=bool(decided) or self._changed)
        self._decided, self._changed = [], False
        for name, fields in decided:
            self.events.emit(name, **fields)
            logger.info("%s %s", name, " ".join(f"{k}={v}" for k, v in fields.items()))
        self._publish_generation()
        self._check_end()

    def _publish_generation(self) -> None:
        """Let the members of a newly formed generation rendezvous (recovery/runtime/cluster.py)."""
        generation = self.membership.generation
        if generation > self._published:
            self._client.set(ready_key(generation), str(generation))
            self._published = generation

    def _snapshot(self, finished: bool) -> dict[str, Any]:
        return {"run_id": self.config.run_id, "finished": finished,
                "membership": self.membership.to_json(),
                "injections": self.injections.to_json(),
                "last_words": self.last_words.to_json(),
                "replies": self.replies.to_json()}

    def _save(self, finished: bool, now: bool = True) -> None:
        """Persist the state when it changed: at once after a decision, else at most every
        PERSIST_EVERY seconds (heartbeats only move steps)."""
        text = json.dumps(self._snapshot(finished), sort_keys=True)
        if text == self._saved or (not now and time.monotonic() - self._saved_at < PERSIST_EVERY):
            return
        self._state.save(json.loads(text))
        self._saved, self._saved_at = text, time.monotonic()

    def _check_end(self) -> None:
        ms = self.membership
        if ms.all_finished and not self.config.supervised:
            self._finish(0, f"all {ms.worker_num} workers finished")
            return
        # Under tftrun, workers of a script that does not use ``recovery`` never register:
        # nothing is missing then.
        overdue = (ms.incomplete_for() > self.config.timeouts.cluster_time_out
                   and (bool(ms.members) or not self.config.supervised))
        if overdue and not self._overdue_reported:
            missing = ms.missing_ranks()
            message = describe_incomplete(self.config.timeouts.cluster_time_out,
                                          ms.worker_num, missing)
            logger.error("%s", message)
            self.events.emit("cluster_timeout", missing=missing, message=message)
            if not self.config.supervised:
                self._finish(EXIT_CLUSTER_TIMEOUT, message)
        self._overdue_reported = overdue


def main() -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s scheduler %(levelname)s %(message)s")
    scheduler = Scheduler(SchedulerConfig.from_env())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: scheduler.request_stop(
            f"received {signal.Signals(signum).name}"))
    return scheduler.run()


if __name__ == "__main__":
    sys.exit(main())
