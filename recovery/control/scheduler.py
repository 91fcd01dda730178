"""The scheduler process: the cluster's single source of truth about membership.

Started by tftrun as ``python -m recovery.control.scheduler``, or by ``recovery.init()`` under
``MS_ROLE=MS_SCHED``, it hosts the cluster's c10d ``TCPStore``; under tftrun on an inherited socket
(``TFT_STORE_FD``), so a relaunch serves on the same port and nobody takes it in between. Decisions are
persisted before the replies, so a ``kill -9`` loses nothing the workers were told (docs/scheduler.md).
"""

from __future__ import annotations

import logging
import math
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from recovery.control import gathering
from recovery.control.claims import LastWords
from recovery.control.fast_verdict import FastVerdicts
from recovery.control.files import Endpoint, StateFile
from recovery.control.handlers import RequestHandlers
from recovery.control.inject import InjectionQueue
from recovery.control.intake import TICK, RequestIntake
from recovery.control.job_proof import JobNotice
from recovery.control.membership import NO_GENERATION, Membership, describe_incomplete
from recovery.control.node_ranks import NodeRanks
from recovery.control.nodes import JobIdentity
from recovery.control.persistence import PERSIST_EVERY, Persistence, spaced
from recovery.control.process_limits import offer_to_oom_killer, raise_open_files_limit
from recovery.control.replies import KeptReplies, SentReplies
from recovery.control.requests import Request
from recovery.control.rpc import (
    NEWS,
    REQUESTS,
    Op,
    describe_bind_error,
    listen_on,
    news_key,
    open_client,
    ready_at,
    ready_value,
    reply_key,
)
from recovery.control.scheduler_config import SchedulerConfig
from recovery.control.signing import MissingToken, ReplayGuard, WeakToken, job_key
from recovery.control.straggler_watch import StragglerWatch
from recovery.control.tcpstore_client import StoreError, TCPStoreClient
from recovery.control.throttle import Throttle
from recovery.events import EventLog
from recovery.quick_exit import exit_now

__all__ = ["Scheduler", "host_store", "main", "EXIT_CLUSTER_TIMEOUT"]

logger = logging.getLogger(__name__)

CHECK_EVERY = 0.1
"""The periodic rules run at most this often, and this soon after any request."""
RULES_SHARE = 0.01
"""The share of a core the periodic rules may take: with many members a run is long, and runs are then
spaced to cost at most this. Deadlines still wake them on time; a member falling behind is seen up to
one spacing late."""
BATCH = 256
"""At most this many waiting requests are handled before their decisions are persisted
and they are answered."""
EXIT_CLUSTER_TIMEOUT = 1
_LOOP_TIMEOUT = timedelta(days=1)  # the ticker wakes the loop long before
_TICKER_TIMEOUT = 1.0
_PAST_DEADLINE = 0.001
_JOIN_TIMEOUT = 5.0
BEHIND_AFTER = 2.0
"""Seconds of batches that each left requests waiting after which the scheduler is
behind: a beat may be waiting in the queue, so no member is judged silent (or stalled)
until it has caught up."""
JOB_KEY_EVERY = 1.0
"""How often the ticker checks that :data:`JOB_KEY` still holds the job's identity."""
_NEWS_EVENTS = frozenset({"generation", "verdict", "inject"})
"""Decisions the workers are to hear before their next (spaced) beat: the news counter
moves, and they beat at once (recovery/control/rpc.py)."""
_SAVED_LATER = frozenset({"register", "attach", "refuse"})
"""Decisions saved with the next spaced save, not before their replies: a process a relaunched scheduler
does not know re-attaches with its next beat, and a refusal changes nothing."""


def host_store(host: str, port: int, listen_fd: int | None) -> Any:
    """Start the store's server in this process and return it."""
    import torch.distributed as dist

    return dist.TCPStore(
        host, port, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=30), master_listen_fd=listen_fd,
    )


class Scheduler(RequestIntake, RequestHandlers, Persistence):
    """Serves membership requests until the job ends; :meth:`run` returns the exit status."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.membership = Membership(config.worker_num, config.token, config.timeouts,
                                     min_worker_num=config.min_worker_num)
        self.events = EventLog(config.log_dir, node_rank=0)  # the scheduler runs on node 0
        self.injections = InjectionQueue()
        self.stragglers = StragglerWatch(config.stragglers, self.membership, self.events)
        self.last_words = LastWords()
        self.replies = KeptReplies()
        self.node_ranks = NodeRanks()
        self._sent = SentReplies()
        self._gathering = gathering.for_ranks(config.worker_num)
        self._key = job_key(config.token, config.run_id, config.epoch)
        self._fast = FastVerdicts(self._key, self.membership)
        self._replays = ReplayGuard()
        self._notice = JobNotice(config.token, JobIdentity(
            config.run_id, config.lineage, config.worker_num, config.node_num, config.epoch),
            self._replays)
        self._refusals: dict[str, Throttle] = {}
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
        self._news: TCPStoreClient | None = None
        self._port = config.port
        self._published = NO_GENERATION
        self._saved = ""
        self._saved_at = 0.0
        self._touched_at = 0.0  # monotonic: the state file's time last brought up to date
        self._overdue_reported = False
        self._started = time.time()
        self._undrained_since: float | None = None  # monotonic: since when every batch left requests waiting
        self._behind: Throttle | None = None  # while behind: the throttle of its reports
        self._stamp: float | None = None  # the signed stamp (sender's wall clock, s) of the request handled
        self._checked_at = -math.inf  # monotonic
        self._check_pending = False  # a request came since the rules last ran
        self._rules_due: float | None = None  # Membership.next_due() when they last ran
        self._unsaved = False  # a change of heartbeats only, not yet persisted
        self._wake_at = math.inf  # when the ticker is to wake the loop (monotonic)
        self._wake_changed = threading.Condition()
        self._woken: tuple[int, int] | None = None  # while run() runs: a pipe to wake it
        self.wakeups = 0  # for a request or a tick (a batch counts once): a quiet scheduler's stays still
        self.ticks = 0
        self.node_beats = 0  # ``node_beat`` requests handled (each for all the ranks of one node)
        # Seconds between two runs of the rules for requests, and between two deferred saves: longer than
        # CHECK_EVERY and PERSIST_EVERY where a run costs more than RULES_SHARE (SAVES_SHARE) of that.
        self._rules_every = CHECK_EVERY
        self._persist_every = PERSIST_EVERY
        self._handlers: dict[Op, Callable[[Request], dict[str, Any] | None]] = {
            Op.TICK: lambda _request: None,
            Op.STATUS: self._on_status,
            Op.REGISTER: self._on_register,
            Op.HEARTBEAT: self._on_heartbeat,
            Op.NODE_BEAT: self._on_node_beat,
            Op.LEAVE: lambda request: self._on_exit(request, by="worker"),
            Op.EXIT: lambda request: self._on_exit(request, by="supervisor"),
            Op.INJECT: self._on_inject,
            Op.LAST_WORDS: self._on_last_words,
            Op.NODE_RANK: self._on_node_rank,
            Op.RETIRE: self._on_retire,
            Op.JOB: lambda _request: self._notice.proof(),
            Op.PEER_FAILED: self._fast.report,
        }

    # ----------------------------------------------------------------- lifecycle
    def run(self) -> int:
        cfg = self.config
        # Started by hand: bind MS_SCHED_HOST only (the store alone would listen on every
        # interface). The socket lives as long as this method.
        try:
            own = None if cfg.supervised else listen_on(cfg.host, cfg.port)
        except OSError as err:
            logger.error("cannot serve on %s:%d: %s", cfg.host, cfg.port,
                         describe_bind_error(err))
            return 1
        server = host_store(cfg.host, cfg.port, cfg.listen_fd if own is None else own.fileno())
        port = self._port = server.port
        self._client = open_client(cfg.host, port, _LOOP_TIMEOUT.total_seconds())
        reloaded = self._reload()
        # The other nodes wait for this key: the scheduler is up, and this is the job.
        self._notice.publish(self._client, cfg.host, port)
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
        self._woken = woken = os.pipe()
        # poll, not select: nodes connect as soon as the store listens, and the pipe may
        # come after a thousand of their connections (select takes no descriptor past 1 023).
        waiting = select.poll()
        waiting.register(woken[0], select.POLLIN)
        loop.start()
        ticker.start()
        while not self._done.is_set() and self._stop_reason is None:
            waiting.poll()
            os.read(woken[0], 64)
        self._woken = None
        if self._stop_reason is not None:
            self._exit = (0, self._stop_reason)
        self._stopping.set()
        self._wake_loop_at(time.monotonic())  # and again until it has left
        loop.join(_JOIN_TIMEOUT)
        ticker.join(_JOIN_TIMEOUT)
        if not loop.is_alive():  # nothing writes to the pipe any more
            os.close(woken[0])
            os.close(woken[1])
        if not loop.is_alive() and not self._failed:
            self._save(finished=True)
        if cfg.log_dir is not None:
            endpoint.remove(cfg.log_dir)
        code, reason = self._exit
        self.events.emit("scheduler_stop", pid=os.getpid(), reason=reason, exitcode=code)
        logger.info("stopping: %s", reason)
        return code

    def request_stop(self, reason: str) -> None:
        """End :meth:`run` soon (safe in a signal handler: it records the reason and
        writes a byte down a pipe)."""
        self._stop_reason = reason
        self._wake_main()

    def _finish(self, code: int, reason: str) -> None:
        self._exit = (code, reason)
        self._done.set()
        self._wake_main()

    def _wake_main(self) -> None:
        """Have :meth:`run`'s wait look again (a byte down its pipe; signal-safe)."""
        woken = self._woken
        if woken is not None:
            try:
                os.write(woken[1], b"x")
            except OSError:  # run() has just closed it: it is not waiting any more
                pass

    def _tick(self, host: str, port: int) -> None:
        """Wake the loop when something is due that no request brings (:meth:`_next_wakeup`), and never
        else: a tick is a request the loop pops. Every :data:`JOB_KEY_EVERY` seconds, put the job's
        identity back in :data:`JOB_KEY` if anyone overwrote it."""
        from torch.distributed import DistError

        client = open_client(host, port, _TICKER_TIMEOUT)
        guard: TCPStoreClient | None = None
        next_guard = time.monotonic() + JOB_KEY_EVERY
        while not self._loop_exited.is_set():
            if time.monotonic() >= next_guard:
                try:
                    guard = guard or TCPStoreClient(host, port, _TICKER_TIMEOUT)
                    self._notice.guard(guard)
                except StoreError:  # a value too long (the connection is dropped), or the store ends
                    if guard is not None:
                        guard.close()
                    guard = None  # a new client next time
                next_guard = time.monotonic() + JOB_KEY_EVERY
            with self._wake_changed:
                left = self._wake_at - time.monotonic()
                if left > 0:
                    self._wake_changed.wait(min(left, next_guard - time.monotonic()))
                    continue
                self._wake_at = math.inf  # the loop sets the next once it has handled this
            try:
                client.queue_push(REQUESTS, TICK)
            except DistError:
                return

    def _wake_loop_at(self, when: float) -> None:
        """Have the ticker wake the loop at ``when`` (monotonic), or earlier if it is to."""
        with self._wake_changed:
            if when < self._wake_at:
                self._wake_at = when
                self._wake_changed.notify()

    def _next_wakeup(self, now: float) -> float:
        """When the loop must run next without a request: the rules' next deadline (and
        at most CHECK_EVERY after a request they have not seen), a deferred save, the
        oldest sent reply's clean-up, the cluster timeout; right away when stopping."""
        if self._stopping.is_set():
            return now
        # Just past a rules deadline: the rules compare strictly (silent > timeout).
        due = [self._rules_due + _PAST_DEADLINE if self._rules_due is not None else math.inf,
               self._checked_at + self._rules_every if self._check_pending else math.inf,
               self._saved_at + self._persist_every if self._unsaved else math.inf,
               self._fast.next_due()]
        # Refusals held back by their throttle are reported when due, even with no request.
        later = [self._sent.next_expiry(), *(throttle.next_due() for throttle in self._refusals.values())]
        return min(due + [when for when in later if when is not None])

    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                self._serve_batch()
        except Exception:
            # Not a request's fault (each is checked first): the store or the disk failed.
            logger.exception("the scheduler's loop failed")
            self._failed = True
            self._finish(1, "internal error (see scheduler.log)")
        finally:
            self._loop_exited.set()
            with self._wake_changed:
                self._wake_changed.notify()  # the ticker sees the loop gone and ends

    def _serve_batch(self) -> None:
        """Wait for a request, handle it and those already waiting with it, answer them."""
        first = self._client.queue_pop(REQUESTS)
        first_at = time.monotonic()
        answers = [self._handle(first)]
        # Where requests come often, those that come shortly after join the batch too
        # (recovery/control/gathering.py): a beat's cost is mostly the loop waking for it.
        wait = self._gathering.wait(first_at, drained=self._undrained_since is None)
        if wait > 0:
            self._stopping.wait(max(0.0, first_at + wait - time.monotonic()))
        # Requests already waiting join the batch: one save and one run of the
        # rules for them all (a burst of registrations costs one fsync, not one each).
        # One length for the batch, not one per request: each is a store round trip.
        counted_at = time.monotonic()
        waiting = self._client.queue_len(REQUESTS)
        if waiting < BATCH:  # all sent before counted_at is handled with this batch
            self._undrained_since = None
        elif self._undrained_since is None:
            self._undrained_since = counted_at
        # Counted, so there (this loop alone pops): popped without the wait for them that
        # a blocking pop sends first, a store round trip each.
        answers.extend(self._handle(self._client.queue_pop(REQUESTS, block=False))
                       for _ in range(min(BATCH - 1, waiting)))
        self._gathering.handled(len(answers))
        self.wakeups += 1
        self._after_request()
        # Only now, with the decisions persisted: what a worker is told survives a
        # kill -9 of this process.
        for rid, reply in answers:
            if rid is not None and reply is not None:
                self._client.set(reply_key(rid), reply)
        for expired in self._sent.expired():
            self._client.delete_key(reply_key(expired))
        self._wake_loop_at(self._next_wakeup(time.monotonic()))

    # ----------------------------------------------------------------- after each request
    def _after_request(self) -> None:
        """Apply the periodic rules when due, persist, then make the decisions known."""
        now = time.monotonic()
        rules_ran = not self._judge_behind(now) and (
            now - self._checked_at >= self._rules_every
            or (self._rules_due is not None and now >= self._rules_due))
        if rules_ran:
            self.membership.check()
            self._checked_at, self._check_pending = now, False
            self._rules_due = self.membership.next_due(after=now)
            self._rules_every = spaced(CHECK_EVERY, time.monotonic() - now, RULES_SHARE)
        self._fast.check(self.config.host, self._port, now)
        decided = [*self.membership.drain_events(), *self._decided]
        if decided or self._changed or self._unsaved or not self._saved:
            self._save(finished=False, now=self._changed or any(
                name not in _SAVED_LATER for name, _fields in decided))
        else:
            self._keep_fresh()
        self._decided, self._changed = [], False
        self.events.emit_all(decided)
        for name, fields in decided:
            logger.info("%s %s", name, " ".join(f"{k}={v}" for k, v in fields.items()))
        self._publish_generation()
        if any(name in _NEWS_EVENTS for name, _fields in decided):
            self._bump_news()
        if rules_ran or decided:  # O(members): not for every heartbeat
            self._check_end()

    def _bump_news(self) -> None:
        """Add one to :data:`NEWS` and set the key of the new count, through a client of its own: anyone
        may set the counter to a non-number, and the store then drops the connection that adds to it
        (such a value is removed and the count starts again). Past counts' keys stay: a supervisor may
        be about to wait for one."""
        for _attempt in range(2):
            try:
                self._news = self._news or TCPStoreClient(self.config.host, self._port,
                                                          _TICKER_TIMEOUT)
                count = self._news.add(NEWS, 1)
                self._news.set(news_key(count), str(count))
                return
            except StoreError as err:  # the connection is closed: a new one resets the counter
                logger.warning("%s could not be raised (%s): reset", NEWS, err)
                self._news = None
                try:
                    self._news = TCPStoreClient(self.config.host, self._port, _TICKER_TIMEOUT)
                    self._news.delete_key(NEWS)
                except StoreError:
                    self._news = None
                    return

    def _judge_behind(self, now: float) -> bool:
        """Whether the queue has not been drained for :data:`BEHIND_AFTER` s: then no verdict is given,
        and a ``scheduler_behind`` event says so (``scheduler_caught_up`` once it has)."""
        behind = 0.0 if self._undrained_since is None else now - self._undrained_since
        if behind <= BEHIND_AFTER:
            if self._behind is not None:
                self._behind = None
                self.events.emit("scheduler_caught_up")
                logger.warning("caught up with the requests: verdicts are given again")
            return False
        self._behind = self._behind or Throttle()
        if (count := self._behind.note()) is not None:
            message = (f"requests have waited for more than {behind:.1f}s (a flood, or more "
                       f"than it can handle): no member is judged until they are handled")
            self.events.emit("scheduler_behind", behind_s=round(behind, 3), batches=count,
                             message=message)
            logger.warning("%s", message)
        return True

    def _publish_generation(self) -> None:
        """Let the members of a newly formed generation rendezvous (recovery/runtime/cluster.py)."""
        generation = self.membership.generation
        if generation > self._published:
            self._client.set(ready_at(self._key, generation),
                             ready_value(self._key, generation, self.membership.active_ranks()))
            self._published = generation

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
    os.umask(os.umask(0) | 0o022)  # what it writes is never world-writable
    raise_open_files_limit()
    offer_to_oom_killer()
    try:
        config = SchedulerConfig.from_env()
    except (MissingToken, WeakToken) as err:
        logger.error("%s", err)
        return 2
    scheduler = Scheduler(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: scheduler.request_stop(
            f"received {signal.Signals(signum).name}"))
    return scheduler.run()


if __name__ == "__main__":
    exit_now(main())
