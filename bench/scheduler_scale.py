"""How the scheduler copes with thousands of ranks: the real scheduler, simulated workers.

    PYTHONPATH=. python bench/scheduler_scale.py [--ranks 64 512 2048 8192] [--procs 4]
        [--mode node rank] [--ranks_per_node 8] [--measure 10] [--heartbeat_timeout 30]
        [--json]

For each size and mode, starts the real scheduler (``python -m recovery.control.scheduler``,
by hand as a launch script would: its own port, no supervisor) for that many workers, and
``--procs`` simulator processes that play the job between them. Nothing trains.

* ``--mode node`` (beats per node, as under tftrun): a simulated supervisor per node of
  ``--ranks_per_node`` ranks, many per thread. Each does what a node's beat server does
  (launcher/supervisor/beats.py), through the library's own code: a ``SchedulerLink``,
  ``recovery.control.node_beats.NodeBeats`` for the batches and their answers, one
  ``node_beat`` per interval (jittered), and a news watch (its own store connection,
  waiting for the scheduler's next news key, as ``NewsWatch`` does; a simulator's watches
  share one thread: bench/news_watches.py) that makes it beat at once on news. Its
  ranks register through it, all in one beat; they report a new step before each beat.
  And as a supervisor's scheduler watch does (launcher/supervisor/watch.py), it asks for
  its status: ``--status node``, tftrun's: its node's, ``snapshot_interval(nodes)`` after
  the last answer (0.5 s, spaced in jobs of more than 128 nodes) and at once on news; in
  jobs of more than 128 nodes a spaced one only when its last beat's reply said the
  scheduler's count of changes moved since its last status;
  ``--status whole``, what tftrun asked before: the whole table (``tftctl status``'s)
  every 0.5 s; ``--status none``: none, as this bench did before.
* ``--mode rank`` (a rank beats itself, as a script started by hand): one thread per
  rank; it connects a ``SchedulerLink``, registers with ``Op.REGISTER`` and heartbeats
  with ``recovery.runtime.heartbeat.Heartbeat`` (timed around its ``beat``), spaced and
  woken by news as a worker's are.

Figures:

* **generation formed**: from "go" (every link connected, all ranks register at once) to
  the scheduler's ``generation`` event; and to the last register reply;
* **scheduler CPU %** of one core (psutil) over ``--measure`` seconds of heartbeats, and
  over as long with nothing but the idle job (``idle``: what a quiet scheduler costs);
* **beat round trip** p50 / p99 over the same window (a ``node_beat`` or a rank's
  heartbeat), and how many beats failed; the status requests answered a second in the
  window and their round trip p50 / p99 (node mode);
* **silence to verdict**: one node (one rank, in rank mode) stops beating; from its last
  answered beat to the scheduler's ``node_silent`` (``verdict``) event, and how far past
  ``heartbeat_timeout`` that came;
* **collapsed**: when members were declared lost before the generation formed (beats
  queued past the heartbeat timeout), instead of the figures above.

Targets (issue 28, node mode): 8192 ranks: CPU < 10 %, p99 < 100 ms, generation < 2 s, a
silent node judged within 1 s of its timeout; 65536 ranks: CPU < 50 %, p99 < 200 ms,
generation < 5 s. The simulators share the machine with the scheduler: on a small host
the large sizes measure the simulator too (see docs/scale.md). Run by hand; not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

import psutil
from common import add_json_flag, emit, free_port
from news_watches import NewsWatches

from launcher.supervisor.watch import SNAPSHOT_INTERVAL, snapshot_interval, stale
from recovery import env as names
from recovery.control.members import Identity
from recovery.control.node_beats import NodeBeats
from recovery.control.rpc import Op, SchedulerLink, SchedulerUnavailable, port_open
from recovery.events import EVENTS_FILE
from recovery.runtime.heartbeat import JITTER, Heartbeat
from recovery.timeouts import Timeouts

TOKEN = "9f86d081884c7d659a2feaa0c55ad015"
"""A job token of full strength (a weak one is refused: recovery/control/signing.py)."""
HOST = "127.0.0.1"
RUN_ID = "scale"
"""The job's run id: with the token, it makes the key requests are signed with."""
REPLY_TIMEOUT = 30.0
_THREAD_STACK = 256 * 1024  # thousands of threads per simulator process
_TARGETS = {8192: {"cpu_percent": 10.0, "p99_ms": 100.0, "generation_s": 2.0,
                   "verdict_past_timeout_s": 1.0},
            65536: {"cpu_percent": 50.0, "p99_ms": 200.0, "generation_s": 5.0}}
_LINKS_AT_ONCE = 64
"""Node links a simulator connects at once in node mode (a thread each while connecting):
thousands at once loaded the machine to hundreds and overflowed the store's backlog."""
_NODES_PER_THREAD = 8
"""Nodes one simulator thread drives in node mode, one beat after another: few enough that
a thread's nodes are not kept waiting for each other's round trips (each node is its own
process in a real job)."""


class TimedHeartbeat(Heartbeat):
    """The library's heartbeat, timing each beat: (wall time sent, round trip seconds)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, on_evicted=self._evicted, **kwargs)
        self.trips: list[tuple[float, float]] = []
        self.failed = 0
        self.last_answered = 0.0
        self.evicted = False

    def _evicted(self, message: str) -> None:
        self.evicted = True

    def beat(self) -> bool:
        self.global_step = (self.global_step or 0) + 1  # a training rank's step moves between beats
        sent, started = time.time(), time.perf_counter()
        answered = super().beat()
        if answered:
            self.trips.append((sent, time.perf_counter() - started))
            self.last_answered = time.time()
        else:
            self.failed += 1
        return answered


@dataclass
class SimulatedRank:
    rank: int
    link: SchedulerLink
    heartbeat: TimedHeartbeat | None = None
    registered_at: float = 0.0
    problem: str = ""


def _register_and_beat(sim: SimulatedRank, timeouts: Timeouts) -> None:
    identity = Identity(str(sim.rank), os.getpid(), 1000 + sim.rank, HOST, sim.rank)
    try:
        reply = sim.link.call(Op.REGISTER, node_id=identity.node_id, pid=identity.pid,
                              incarnation=identity.incarnation, host=identity.host,
                              rank=identity.rank)
    except ConnectionError as err:
        sim.problem = f"register: {err}"
        return
    sim.registered_at = time.time()
    if not reply.get("ok"):
        sim.problem = f"register refused: {reply}"
        return
    # Spaced and woken by news as a worker's (recovery/runtime/cluster.py).
    sim.heartbeat = TimedHeartbeat(sim.link, identity, timeouts.beat_interval,
                                   int(reply["generation"]), news_every=timeouts.heartbeat_interval)
    sim.heartbeat.start()


def simulate(ranks: list[int], port: int, timeouts: Timeouts, commands: Any, results: Any) -> None:
    """One simulator process: its ranks connect, then on "go" register and beat until
    told to silence one rank or to stop."""
    threading.stack_size(_THREAD_STACK)
    sims = [SimulatedRank(r, SchedulerLink(HOST, port, TOKEN, REPLY_TIMEOUT, run_id=RUN_ID)) for r in ranks]
    started = time.monotonic()
    unconnected = sum(not s.link.wait_connected(120) for s in sims)
    print(f"simulator {os.getpid()}: {len(sims)} links in {time.monotonic() - started:.1f}s",
          file=sys.stderr, flush=True)
    results.put(("connected", unconnected))
    assert commands.get() == "go"
    registrars = [threading.Thread(target=_register_and_beat, args=(s, timeouts)) for s in sims]
    for thread in registrars:
        thread.start()
    for thread in registrars:
        thread.join()
    results.put(("registered", max(s.registered_at for s in sims),
                 [s.problem for s in sims if s.problem][:3]))
    by_rank = {s.rank: s for s in sims}
    while (command := commands.get()) != "stop":
        silenced = by_rank[command[1]].heartbeat
        assert silenced is not None
        silenced.stop()
        results.put(("silenced", silenced.last_answered))
    beats = [s.heartbeat for s in sims if s.heartbeat is not None]
    for beat in beats:
        beat.stop()
    for sim in sims:
        sim.link.close()
    _send_trips(results, beats)


def _send_trips(results: Any, beaters: list[Any],
                statuses: list[tuple[float, float]] | None = None) -> None:
    """The timed beats of a simulator's heartbeats (nodes), its failed beats and evictions,
    and its timed status requests (nodes)."""
    results.put(("trips", [t for b in beaters for t in b.trips], sum(b.failed for b in beaters),
                 sum(b.evicted for b in beaters), statuses or []))


class SimulatedNode:
    """One node's supervisor, as launcher/supervisor/beats.py beats for its ranks."""

    def __init__(self, index: int, ranks: range, port: int, timeouts: Timeouts,
                 news: NewsWatches, status: str, nodes: int) -> None:
        self.name = node_name(index)
        self.status_fields: dict[str, Any] | None = (
            None if status == "none" else {} if status == "whole" else
            {"first_rank": ranks.start, "nproc": len(ranks), "missing": index == 0})
        """What its status request holds (None: it asks none); node 0 asks for the missing
        ranks too, as the supervisor on the scheduler's node does."""
        self.status_every = SNAPSHOT_INTERVAL if status == "whole" else snapshot_interval(nodes)
        self.status_on_news = status == "node"
        self.status_when_changed = status == "node" and self.status_every > SNAPSHOT_INTERVAL
        """A large job's supervisor asks only when its beat said the count of changes
        moved since its last status (``SchedulerWatch.facts_heard``)."""
        self.status_facts: int | None = None
        """The count of changes its last status said."""
        self.status_at = math.inf
        self.status_trips: list[tuple[float, float]] = []
        self.ranks = ranks
        self.link = SchedulerLink(HOST, port, TOKEN, REPLY_TIMEOUT, run_id=RUN_ID,
                                  connect=False)
        self.beats = NodeBeats(timeouts.heartbeat_timeout, timeouts.beat_interval, JITTER)
        self.wake = threading.Event()
        """Set on news: its driver's (shared by the nodes of a driver thread)."""
        self.news_came = False
        self.watching = threading.Event()
        """Set once the news watch has read the counter: its connection is made."""
        news.watch(self._on_news)
        self.step = 0
        self.registered: set[int] = set()
        self.registered_at = 0.0
        self.problem = ""
        self.trips: list[tuple[float, float]] = []
        self.failed = self.evicted = 0
        self.last_answered = 0.0
        self.silenced = False

    def identity(self, rank: int) -> dict[str, Any]:
        return {"node_id": str(rank), "pid": os.getpid(), "incarnation": 1000 + rank,
                "host": HOST, "rank": rank}

    def _on_news(self) -> None:
        self.news_came = True
        if self.status_on_news and self.status_at < math.inf:
            self.status_at = time.monotonic()
        self.watching.set()
        self.wake.set()

    def register(self, now: float) -> None:
        for rank in self.ranks:
            self.beats.heard(rank, "register", self.identity(rank), now)
        if self.status_fields is not None:  # the nodes' watches drift apart
            self.status_at = now + random.uniform(0, self.status_every)

    def due(self) -> float:
        return math.inf if self.silenced else -math.inf if self.news_came \
            else min(self.beats.next_due(), self.status_at)

    def act(self, now: float) -> None:
        """A beat, when one is due or news came; a status request, when one is due."""
        if self.news_came or now >= self.beats.next_due():
            self.news_came = False
            self.beat(now)
        if time.monotonic() >= self.status_at:
            if self.status_when_changed and not stale(self.status_facts, self.beats.facts):
                self.status_at = time.monotonic() + self.status_every  # nothing new
            else:
                self.ask_status()

    def ask_status(self) -> None:
        """A status request, as the supervisor's scheduler watch sends one."""
        sent_at, started = time.time(), time.perf_counter()
        try:
            reply = self.link.call(Op.STATUS, **(self.status_fields or {}))
            self.status_facts = reply.get("facts")
            self.status_trips.append((sent_at, time.perf_counter() - started))
        except SchedulerUnavailable as err:
            self.problem = self.problem or f"status: {err}"
        self.status_at = time.monotonic() + self.status_every

    def beat(self, now: float) -> None:
        self.step += 1  # its ranks train: each reports a new step before the beat
        for rank in self.registered:
            self.beats.heard(rank, "heartbeat", {**self.identity(rank), "step": self.step,
                                                 "phase": "train"}, now)
        for sent in self.beats.beats(now):
            sent_at, started = time.time(), time.perf_counter()
            try:
                reply = self.link.call(Op.NODE_BEAT, node=self.name,
                                       ranks=[entry for _key, entry in sent])
                registered = self.beats.fan_out(sent, reply)
            except (SchedulerUnavailable, ValueError) as err:
                self.failed += 1
                self.problem = self.problem or f"beat: {err}"
                continue
            self.trips.append((sent_at, time.perf_counter() - started))
            self.last_answered = time.time()
            for rank, answer in registered.items():
                if answer.get("ok"):
                    self.registered.add(rank)
                else:
                    self.problem = self.problem or f"register refused: {answer}"
            self.evicted += sum(1 for key, _entry in sent
                                if self.beats.ranks[key].judged)
        if len(self.registered) == len(self.ranks) and not self.registered_at:
            self.registered_at = time.time()


def node_name(index: int) -> str:
    return f"sim/{index}"


def _drive(nodes: list[SimulatedNode], stop: threading.Event) -> None:
    """Beat for ``nodes``, each when it is due or has news, until ``stop``."""
    wake = threading.Event()
    for node in nodes:
        node.wake = wake
    while not stop.is_set():
        node = min(nodes, key=SimulatedNode.due)
        wait = node.due() - time.monotonic()
        if wait > 0:
            wake.wait(min(wait, 0.5))
            wake.clear()
            continue
        node.act(time.monotonic())


def simulate_nodes(nodes: list[int], per_node: int, status: str, total: int, port: int,
                   timeouts: Timeouts, commands: Any, results: Any) -> None:
    """One simulator process in node mode: its nodes connect, then on "go" register their
    ranks and beat until told to silence one node or to stop."""
    threading.stack_size(_THREAD_STACK)
    started = time.monotonic()
    news = NewsWatches(HOST, port, spacing=timeouts.heartbeat_interval)
    news.start()
    sims = {n: SimulatedNode(n, range(n * per_node, (n + 1) * per_node), port, timeouts, news,
                             status, total)
            for n in nodes}
    everyone = list(sims.values())
    for first in range(0, len(everyone), _LINKS_AT_ONCE):
        wave = everyone[first:first + _LINKS_AT_ONCE]
        for sim in wave:
            sim.link.start()
        for sim in wave:
            sim.link.wait_connected(120)
    unconnected = sum(not (s.link.wait_connected(0) and s.watching.wait(120)) for s in everyone)
    print(f"simulator {os.getpid()}: {len(sims)} node links and news watches in "
          f"{time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    results.put(("connected", unconnected))
    assert commands.get() == "go"
    now = time.monotonic()
    for sim in sims.values():
        sim.register(now)
    stop = threading.Event()
    threads = max(1, len(everyone) // _NODES_PER_THREAD)
    drivers = [threading.Thread(target=_drive, args=(everyone[i::threads], stop))
               for i in range(threads)]
    for thread in drivers:
        thread.start()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not all(s.registered_at or s.problem for s in everyone):
        time.sleep(0.05)
    results.put(("registered", max(s.registered_at for s in everyone),
                 [s.problem for s in everyone if s.problem][:3]))
    while (command := commands.get()) != "stop":
        silenced = sims[command[1]]
        silenced.silenced = True
        results.put(("silenced", silenced.last_answered))
    stop.set()
    for thread in drivers:
        thread.join()
    news.close()
    for sim in everyone:
        sim.link.close()
    _send_trips(results, everyone, [t for s in everyone for t in s.status_trips])


def _scheduler_env(workers: int, port: int, tmp: Path, heartbeat_timeout: float) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        names.MS_ROLE: names.ROLE_SCHEDULER, names.MS_WORKER_NUM: str(workers),
        names.MS_SCHED_HOST: HOST, names.MS_SCHED_PORT: str(port),
        names.MS_RECOVERY_PATH: str(tmp / "recovery"), names.TFT_RUN_ID: RUN_ID,
        names.TFT_LOG_DIR: str(tmp / "logs"), names.TFT_JOB_TOKEN: TOKEN,
        names.TFT_HEARTBEAT_TIMEOUT: str(heartbeat_timeout),
        names.TFT_CLUSTER_TIME_OUT: "3600",
    })
    return env


class EventTail:
    """The scheduler's events.jsonl, read on from where the last look stopped (thousands
    of events at the large sizes: re-reading them all would load the machine)."""

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / EVENTS_FILE
        self.seen: list[dict[str, Any]] = []
        self._offset = 0

    def _read_on(self) -> None:
        try:
            with open(self.path, "rb") as file:
                file.seek(self._offset)
                chunk = file.read()
        except FileNotFoundError:
            return
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        self.seen.extend(json.loads(line) for line in complete.splitlines() if line.strip())

    def count(self, event: str) -> int:
        self._read_on()
        return sum(seen["event"] == event for seen in self.seen)

    def wait(self, timeout: float, event: str, give_up: str | None = None,
             **match: Any) -> dict[str, Any] | None:
        """The first ``event`` matching ``match``; ``None`` once a ``give_up`` event came
        first (the control plane collapsed); TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read_on()
            for seen in self.seen:
                if seen["event"] == event and all(seen.get(k) == v for k, v in match.items()):
                    return seen
                if seen["event"] == give_up:
                    return None
            time.sleep(0.05)
        raise TimeoutError(f"no {event} event {match} within {timeout:g}s")


def _cpu_percent(process: psutil.Process, seconds: float) -> tuple[float, list[float]]:
    """The process's CPU time over the next ``seconds``, as a percentage of one core, and
    its busiest threads' shares (the loop's Python, the store's event loop), busiest first."""
    def times() -> dict[int, float]:
        return {t.id: t.user_time + t.system_time for t in process.threads()}

    before, started = times(), time.monotonic()
    time.sleep(seconds)
    after = times()
    elapsed = time.monotonic() - started
    used = {tid: spent - before.get(tid, 0.0) for tid, spent in after.items()}
    shares = sorted((100.0 * u / elapsed for u in used.values()), reverse=True)
    return 100.0 * sum(used.values()) / elapsed, [round(share, 1) for share in shares[:3]]


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


@dataclass
class Simulators:
    """The simulator processes and their command and result queues."""

    processes: list[Any] = field(default_factory=list)
    commands: list[Any] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)

    def gather(self, kind: str, timeout: float) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + timeout
        replies = [self._get(queue, process, deadline)
                   for queue, process in zip(self.results, self.processes)]
        if any(reply[0] != kind for reply in replies):
            raise RuntimeError(f"expected {kind} from every simulator, got {replies}")
        return replies

    @staticmethod
    def _get(queue: Any, process: Any, deadline: float) -> tuple[Any, ...]:
        while time.monotonic() < deadline:
            try:
                return queue.get(timeout=1.0)
            except Empty:
                if not process.is_alive():
                    raise RuntimeError(f"a simulator exited {process.exitcode}") from None
        raise TimeoutError("a simulator did not answer in time")

    def tell_all(self, command: Any) -> None:
        for queue in self.commands:
            queue.put(command)


def measure(workers: int, procs: int, window: float, heartbeat_timeout: float,
            mode: str, per_node: int, status: str) -> dict[str, Any]:
    """One size's figures in one mode (see the module docstring)."""
    timeouts = Timeouts(heartbeat_timeout=heartbeat_timeout)
    interval = timeouts.beat_interval
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as scratch:
        tmp, port = Path(scratch), free_port()
        events = EventTail(tmp / "logs")
        scheduler = subprocess.Popen(
            [sys.executable, "-m", "recovery.control.scheduler"],
            env=_scheduler_env(workers, port, tmp, heartbeat_timeout),
            stdout=subprocess.DEVNULL, stderr=open(tmp / "scheduler.log", "w"))
        sims = Simulators()
        told_to_stop = False
        try:
            while not port_open(HOST, port):
                if scheduler.poll() is not None:
                    raise RuntimeError(f"the scheduler exited {scheduler.returncode}")
                time.sleep(0.05)
            sched = psutil.Process(scheduler.pid)
            nodes = workers // per_node
            for index in range(procs):
                sims.commands.append(context.Queue())
                sims.results.append(context.Queue())
                target, args = (
                    (simulate_nodes, (list(range(index, nodes, procs)), per_node, status,
                                      nodes))
                    if mode == "node" else (simulate, (list(range(index, workers, procs)),)))
                process = context.Process(target=target, args=(
                    *args, port, timeouts, sims.commands[-1], sims.results[-1]), daemon=True)
                process.start()
                sims.processes.append(process)
            unconnected = sum(r[1] for r in sims.gather("connected", 900))
            idle_cpu, _idle_threads = _cpu_percent(sched, window)
            go = time.time()
            sims.tell_all("go")
            # A verdict before the generation: beats queued past the heartbeat timeout,
            # members were declared lost while the others registered (seen at 8192).
            formed = events.wait(600, "generation", give_up="verdict")
            registered = sims.gather("registered", 600)
            problems = [p for r in registered for p in r[2]]
            if formed is None:
                sims.tell_all("stop")
                sims.gather("trips", 300)
                told_to_stop = True
                return {"ranks": workers, "mode": mode, "simulator_processes": procs,
                        "heartbeat_interval_s": interval,
                        "heartbeat_timeout_s": heartbeat_timeout, "unconnected": unconnected,
                        "collapsed": True, "verdicts_before_generation": events.count("verdict"),
                        "register_problems": problems[:3],
                        "last_register_reply_s": max(r[1] for r in registered) - go}
            time.sleep(2 * interval)  # every rank's heartbeat under way
            window_start = time.time()
            busy_cpu, busy_threads = _cpu_percent(sched, window)
            window_end = time.time()
            silent = 0  # node 0, or rank 0: in the first simulator either way
            sims.commands[0].put(("silence", silent))
            last_beat = sims.results[0].get(timeout=60)[1]
            try:  # the other figures stand without it
                verdict = (events.wait(heartbeat_timeout + 120, "node_silent",
                                       node=node_name(silent)) if mode == "node" else
                           events.wait(heartbeat_timeout + 120, "verdict", rank=silent))
            except TimeoutError:
                verdict = {"ts": math.nan}
            behind = events.count("scheduler_behind")
            sims.tell_all("stop")
            trips_replies = sims.gather("trips", 300)
            told_to_stop = True
        finally:
            for process in sims.processes:  # at once when the run failed or was stopped
                process.join(60 if told_to_stop else 0)
                if process.is_alive():
                    process.kill()
            scheduler.terminate()
            scheduler.wait(60)
    trips = [rtt for reply in trips_replies for sent, rtt in reply[1]
             if window_start <= sent <= window_end]
    statuses = [rtt for reply in trips_replies for sent, rtt in reply[4]
                if window_start <= sent <= window_end]
    return {
        "ranks": workers, "mode": mode, "nodes": workers // per_node if mode == "node" else None,
        "simulator_processes": procs, "heartbeat_interval_s": interval,
        "heartbeat_timeout_s": heartbeat_timeout, "unconnected": unconnected,
        "collapsed": False, "register_problems": problems,
        "generation_formed_s": formed["ts"] - go,
        "last_register_reply_s": max(r[1] for r in registered) - go,
        "scheduler_cpu_percent": busy_cpu, "scheduler_idle_cpu_percent": idle_cpu,
        "scheduler_busiest_threads_cpu_percent": busy_threads,
        "beats_in_window": len(trips), "beats_per_s": len(trips) / (window_end - window_start),
        "rtt_p50_ms": _percentile(trips, 0.5) * 1e3, "rtt_p99_ms": _percentile(trips, 0.99) * 1e3,
        "rtt_mean_ms": statistics.fmean(trips) * 1e3 if trips else float("nan"),
        "failed_beats": sum(r[2] for r in trips_replies),
        "evicted": sum(r[3] for r in trips_replies),
        "scheduler_behind_events": behind,
        "status": status if mode == "node" else "none",
        "statuses_per_s": len(statuses) / (window_end - window_start),
        "status_rtt_p50_ms": _percentile(statuses, 0.5) * 1e3,
        "status_rtt_p99_ms": _percentile(statuses, 0.99) * 1e3,
        "silence_to_verdict_s": verdict["ts"] - last_beat,
        "verdict_past_timeout_s": verdict["ts"] - last_beat - heartbeat_timeout,
    }


def text(results: list[dict[str, Any]], cores: int) -> list[str]:
    lines = [f"scheduler at scale ({cores} cores; targets in node mode: 8192 ranks CPU < 10 %, "
             f"p99 < 100 ms, generation < 2 s, verdict < 1 s past the timeout; 65536 ranks "
             f"CPU < 50 %, p99 < 200 ms, generation < 5 s)",
             f"{'ranks':>6} {'mode':>5} {'gen s':>7} {'last reg s':>10} {'cpu %':>6} "
             f"{'idle %':>6} {'beats/s':>8} {'p50 ms':>7} {'p99 ms':>8} {'failed':>6} "
             f"{'verdict s':>9} {'past timeout s':>14} {'status/s':>8} {'status p99':>10}"]
    for r in results:
        if "failed" in r:
            lines.append(f"{r['ranks']:>6} {r['mode']:>5} not measured: {r['failed']}")
            continue
        if r["collapsed"]:
            lines.append(f"{r['ranks']:>6} {r['mode']:>5} no generation: "
                         f"{r['verdicts_before_generation']} verdicts first (beats queued past "
                         f"the heartbeat timeout)")
            continue
        lines.append(f"{r['ranks']:>6} {r['mode']:>5} {r['generation_formed_s']:7.2f} "
                     f"{r['last_register_reply_s']:10.2f} "
                     f"{r['scheduler_cpu_percent']:6.1f} {r['scheduler_idle_cpu_percent']:6.1f} "
                     f"{r['beats_per_s']:8.0f} {r['rtt_p50_ms']:7.1f} {r['rtt_p99_ms']:8.1f} "
                     f"{r['failed_beats']:>6} {r['silence_to_verdict_s']:9.2f} "
                     f"{r['verdict_past_timeout_s']:14.2f} {r['statuses_per_s']:8.0f} "
                     f"{r['status_rtt_p99_ms']:10.1f}")
    return lines


def met_targets(results: list[dict[str, Any]]) -> dict[str, dict[str, bool] | None]:
    """Per target size measured in node mode: whether each target was met (None: collapsed)."""
    names = {"cpu_percent": "scheduler_cpu_percent", "p99_ms": "rtt_p99_ms",
             "generation_s": "generation_formed_s",
             "verdict_past_timeout_s": "verdict_past_timeout_s"}
    met: dict[str, dict[str, bool] | None] = {}
    for r in results:
        targets = _TARGETS.get(r["ranks"])
        if targets is None or r["mode"] != "node" or "failed" in r:
            continue
        met[str(r["ranks"])] = None if r["collapsed"] else {
            name: abs(r[names[name]]) < limit for name, limit in targets.items()}
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 512, 2048, 8192])
    parser.add_argument("--mode", nargs="+", choices=["node", "rank"], default=["node", "rank"],
                        help="node: a simulated supervisor beats per node; rank: each rank "
                             "beats itself (both: side by side)")
    parser.add_argument("--ranks_per_node", type=int, default=8)
    parser.add_argument("--status", choices=["node", "whole", "none"], default="node",
                        help="node mode: each simulated supervisor asks for its status: its "
                             "node's, spaced by the job's size and on news (tftrun's), the "
                             f"whole table every {SNAPSHOT_INTERVAL} s (tftrun's before), "
                             "or none")
    parser.add_argument("--procs", type=int, default=4, help="simulator processes")
    parser.add_argument("--measure", type=float, default=10.0,
                        help="seconds of each CPU and round-trip window")
    parser.add_argument("--heartbeat_timeout", type=float, default=30.0,
                        help="the job's heartbeat timeout (tftrun's default; beats every "
                             "timeout / 5; in rank mode news read every min(1 s, timeout "
                             "/ 5), in node mode waited for)")
    add_json_flag(parser)
    args = parser.parse_args()
    # A SIGTERM (a timeout, a kill) unwinds as an exit, so that the clean-up runs: the
    # simulators are daemons, and by default a SIGTERM would leave them running.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    if any(workers % args.ranks_per_node for workers in args.ranks) and "node" in args.mode:
        parser.error(f"--ranks must be multiples of --ranks_per_node={args.ranks_per_node}")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # a c10d warning per simulated connect
    # Every c10d store client does a reverse DNS lookup of the server's address when it
    # connects (getnameinfo on ``::ffff:127.0.0.1``, which /etc/hosts cannot answer); a
    # resolver that drops one query in a few dozen stalls that connect for glibc's default
    # 5 s retry, and the simulators open thousands of connects. One second and no retry
    # keeps the large sizes measurable; a user's own RES_OPTIONS is left alone
    # (docs/scale.md). The simulator processes inherit it (spawned after this).
    os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
    results = []
    for workers in args.ranks:
        for mode in args.mode:
            try:
                results.append(measure(workers, args.procs, args.measure,
                                       args.heartbeat_timeout, mode, args.ranks_per_node,
                                       args.status))
            except (RuntimeError, TimeoutError) as err:  # the other sizes still count
                results.append({"ranks": workers, "mode": mode, "failed": str(err),
                                "load_average_1_5": os.getloadavg()[:2]})
            print(f"{workers} ranks measured ({mode} mode), load {os.getloadavg()[:2]}",
                  file=sys.stderr, flush=True)
    emit({"cores": os.cpu_count(), "load_average_1_5_15": os.getloadavg(),
          "res_options": os.environ["RES_OPTIONS"], "ranks_per_node": args.ranks_per_node,
          "targets": _TARGETS, "met": met_targets(results),
          "sizes": results}, args.json, text(results, os.cpu_count() or 0))


if __name__ == "__main__":
    main()
