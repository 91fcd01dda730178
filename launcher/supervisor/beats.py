"""The node's beat server: its workers' heartbeats in, one ``node_beat`` per node out.

Workers connect to a Unix socket (``TFT_BEAT_SOCKET``) in a folder only this user may enter.
One thread answers them from the scheduler's latest reply; another beats on time, for urgent
reports and on the scheduler's news, so that the supervisor's loop never waits on them.
"""

from __future__ import annotations

import logging
import math
import selectors
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from recovery.control.news_watch import NewsWatch
from recovery.control.node_beats import MAX_LOCAL_BYTES, NodeBeats, decode, encode
from recovery.control.rpc import Op, SchedulerLink, SchedulerUnavailable
from recovery.control.signing import WRONG_TOKEN, local_proof_ok
from recovery.control.throttle import Throttle
from recovery.runtime.heartbeat import JITTER
from recovery.timeouts import Timeouts

__all__ = ["BeatServer"]

logger = logging.getLogger(__name__)

_REPLY_TIMEOUT = 5.0
_JOIN = 5.0
_GATHER = 0.05
"""Seconds a beat for a registration waits for the node's other ranks to register too
(they start together): one beat for them all."""


class BeatServer:
    """Serves the node's workers and beats for them under the name ``node``."""

    def __init__(self, node: str, host: str, port: int, token: str, run_id: str, epoch: str,
                 timeouts: Timeouts, on_news: Callable[[], None] | None = None,
                 on_facts: Callable[[int], None] | None = None) -> None:
        """``on_news``: called (from the news watch's thread) when the scheduler has news,
        besides the beat it brings; ``on_facts``: with the scheduler's count of changes
        after each answered beat that said it (from the beating thread)."""
        self.node = node
        self._on_news_too = on_news
        self._on_facts = on_facts
        self._folder = Path(tempfile.mkdtemp(prefix="tft-beats-"))
        self.path = str(self._folder / "beats.sock")
        self._beats = NodeBeats(timeouts.heartbeat_timeout, timeouts.beat_interval,
                                jitter=JITTER)
        self._token = token
        self._link = SchedulerLink(host, port, token, _REPLY_TIMEOUT, connect=False,
                                   run_id=run_id, epoch=epoch)
        self._lock = threading.Lock()  # the NodeBeats, and sends on the connections
        self._wake = threading.Event()
        self._news_came = threading.Event()
        self._news = NewsWatch(host, port, self._on_news, spacing=timeouts.heartbeat_interval)
        self._closed = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(self.path)
        self._listener.listen(1024)
        self._connections: dict[int, socket.socket] = {}
        self._failing = Throttle()
        self._threads = [threading.Thread(target=self._serve, name="beat-server", daemon=True),
                         threading.Thread(target=self._beat, name="node-beats", daemon=True)]

    def start(self) -> None:
        """Serve; the scheduler is connected to once a worker connects (a script that
        does not use ``recovery`` never does)."""
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        self._listener.close()
        self._link.close()  # a beat waiting for a connection gives up
        for thread in self._threads:
            if thread.is_alive():
                thread.join(_JOIN)
        self._news.close()
        with self._lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()
        shutil.rmtree(self._folder, ignore_errors=True)

    # ----------------------------------------------------------------- local side
    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ)
        try:
            while not self._closed.is_set():
                for ready, _mask in selector.select(timeout=0.5):
                    sock = ready.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        self._accept(selector)
                    else:
                        self._read(selector, sock)
        except OSError:
            if not self._closed.is_set():
                logger.exception("the beat server failed")
        finally:
            selector.close()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        conn, _address = self._listener.accept()
        self._link.start()
        self._news.start()
        with self._lock:
            self._connections[conn.fileno()] = conn
        selector.register(conn, selectors.EVENT_READ)

    def _read(self, selector: selectors.BaseSelector, conn: socket.socket) -> None:
        key = conn.fileno()
        try:
            data = conn.recv(MAX_LOCAL_BYTES)
        except OSError:
            data = b""
        message = decode(data) if data else None
        if message is None:  # closed (its process ended) or not ours to read
            selector.unregister(conn)
            with self._lock:
                self._beats.forget(key)
                self._connections.pop(key, None)
            conn.close()
            return
        op = message.get("op")
        urgent = False
        with self._lock:
            if op == "news":
                self._send(key, {"news": self._beats.news})
            elif op in (Op.REGISTER.value, Op.HEARTBEAT.value) \
                    and not local_proof_ok(message.get("proof"), self._token):
                self._send(key, WRONG_TOKEN)  # another job's worker: refused for good
            elif op in (Op.REGISTER.value, Op.HEARTBEAT.value):
                urgent = self._beats.heard(key, op, message, time.monotonic())
                if op == Op.HEARTBEAT.value:
                    self._send(key, self._beats.answer(key) or {"waiting": True})
        if urgent:
            self._wake.set()

    def _send(self, key: int, message: dict[str, object]) -> None:
        """Send to connection ``key`` (under the lock); a closed one is left to the
        server thread."""
        conn = self._connections.get(key)
        if conn is not None:
            try:
                conn.send(encode(message))
            except OSError:
                pass

    # ----------------------------------------------------------------- scheduler side
    def _on_news(self) -> None:
        """The scheduler's news counter moved (the news watch's thread)."""
        self._news_came.set()
        if self._on_news_too is not None:
            self._on_news_too()
        self._wake.set()

    def _beat(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                due = self._beats.next_due()
            now = time.monotonic()
            if due == -math.inf:
                self._closed.wait(_GATHER)
            elif now < due and not self._news_came.is_set():
                self._wake.wait(due - now)
                self._wake.clear()
                if self._closed.is_set():
                    return
            if self._news_came.is_set():
                self._news_came.clear()
                self._send_beats()  # something happened: every rank hears it now
                continue
            with self._lock:
                due = self._beats.next_due()
            if time.monotonic() >= due:
                self._send_beats()

    def _send_beats(self) -> None:
        # The link starts connecting only when the first worker connects: a call before
        # it is made would fail, and the registration wait for the next beat.
        if not self._link.wait_connected(_REPLY_TIMEOUT) and self._closed.is_set():
            return
        with self._lock:
            batches = self._beats.beats(time.monotonic())
        for sent in batches:
            try:
                reply = self._link.call(Op.NODE_BEAT, node=self.node,
                                        ranks=[entry for _key, entry in sent])
                with self._lock:
                    for key, answer in self._beats.fan_out(sent, reply).items():
                        self._send(key, answer)
                    facts = self._beats.facts
                if facts is not None and self._on_facts is not None:
                    self._on_facts(facts)
            except (SchedulerUnavailable, ValueError) as err:
                if (count := self._failing.note()) is not None:
                    logger.warning("node beat failed %d time(s): %s", count, err)
