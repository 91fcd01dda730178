"""Many simulated nodes' news watches in one thread: what bench/scheduler_scale.py needs at
65 536 ranks.

A real node's supervisor holds one ``recovery.control.news_watch.NewsWatch``: a store
connection and a thread blocked in a ``WAIT`` on the scheduler's next news key. A
simulator process plays thousands of nodes, and a thread per node's watch (8192 at
65 536 ranks) kept the simulators from ever connecting (load 700: docs/scale.md).
:class:`NewsWatches` holds the same connection per node and sends the store the same
requests, in the same order, with the same timings (:class:`NewsWatch`'s ``_follow``):

* on (re)connecting, ``VALIDATE`` and a ``PING`` whose nonce must come back;
* the counter read as ``CHECK``, then ``WAIT`` and ``GET`` (0 while unset, no number
  while a stranger's value is there);
* a callback when the count differs from the one seen (and at the first read), then
  ``spacing`` seconds before the counter is read again;
* otherwise a ``WAIT`` on the next count's key, cancelled (``CANCEL_WAIT``) after
  ``rearm`` seconds, then the counter again;
* any error: the connection closed, a new one after a pause.

But all of a process's watches are coroutines of one asyncio loop (epoll) in one thread.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import struct
import threading
from collections.abc import Callable

from recovery.control.rpc import MAX_NEWS_BYTES, NEWS, news_key
from recovery.control.tcpstore_client import (
    READY,
    STOP_WAITING,
    VALIDATION_MAGIC,
    WAIT_CANCELED,
    Query,
    StoreError,
    encoded_key,
    encoded_keys,
)

__all__ = ["NewsWatches"]

_TIMEOUT = 5.0
"""Seconds a connect or an answer may take (``NewsWatch``'s connect timeout, which its
client keeps for every operation)."""
_RECONNECT_PAUSE = 0.5
_CLOSING = 60.0
_RECANCEL = 0.1
"""Seconds :meth:`NewsWatches.close` waits before it cancels the watches still running again."""
_CONNECTING = 64
"""Connects under way at once: thousands at once overflow the store's listen backlog,
and each refused SYN costs a second or more."""


class _Connection:
    """One watch's store connection: a request written, its answer read, each in time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def ask(self, request: bytes, answer: str, timeout: float = _TIMEOUT) -> int:
        self.writer.write(request)
        return await self.read(answer, timeout)

    async def read(self, layout: str, timeout: float = _TIMEOUT) -> int:
        data = await asyncio.wait_for(self.reader.readexactly(struct.calcsize(layout)), timeout)
        return int(struct.unpack(layout, data)[0])

    async def count(self) -> int | None:
        """The counter's value (0 while unset); ``None`` when it is not a number."""
        if await self.ask(bytes([Query.CHECK]) + encoded_keys([NEWS]), "<B") != READY:
            return 0
        if await self.ask(bytes([Query.WAIT]) + encoded_keys([NEWS]), "<B") != STOP_WAITING:
            raise StoreError("the store answered a wait unexpectedly")
        size = await self.ask(bytes([Query.GET]) + encoded_key(NEWS), "<Q")
        if size > MAX_NEWS_BYTES:
            raise StoreError(f"a counter of {size} bytes")
        value = await asyncio.wait_for(self.reader.readexactly(size), _TIMEOUT)
        try:
            return int(value)
        except ValueError:
            return None

    async def wait(self, key: str, timeout: float) -> None:
        """Wait for ``key`` up to ``timeout``, then cancel the wait (its answer read)."""
        self.writer.write(bytes([Query.WAIT]) + encoded_keys([key]))
        try:
            answer = await asyncio.wait_for(self.reader.readexactly(1), timeout)
        except TimeoutError:  # the key may still come before the cancel does
            self.writer.write(bytes([Query.CANCEL_WAIT]))
            answer = await asyncio.wait_for(self.reader.readexactly(1), _TIMEOUT)
            if answer[0] == STOP_WAITING:
                answer = await asyncio.wait_for(self.reader.readexactly(1), _TIMEOUT)
                if answer[0] != WAIT_CANCELED:
                    raise StoreError("it answered a cancelled wait unexpectedly") from None
                return
            if answer[0] != WAIT_CANCELED:
                raise StoreError("it answered a cancelled wait unexpectedly") from None
            return
        if answer[0] != STOP_WAITING:
            raise StoreError("it answered a wait unexpectedly")


class NewsWatches:
    """News watches for many nodes, one connection each, one thread for them all.

    Args:
        host: the scheduler's store.
        port: its port.
        spacing: seconds between two callbacks of one watch at the least.
        rearm: seconds a wait lasts before the counter is read again.
    """

    def __init__(self, host: str, port: int, spacing: float, rearm: float = 30.0) -> None:
        self._where = (host, port)
        self._spacing = spacing
        self._rearm = rearm
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="news-watches",
                                        daemon=True)
        self._connecting: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._thread.start()

    def watch(self, on_news: Callable[[], object]) -> None:
        """A node's watch: ``on_news`` is called in the watches' thread (it must not
        block) once at the start and whenever the counter moves."""
        asyncio.run_coroutine_threadsafe(self._add(on_news), self._loop).result()

    async def _add(self, on_news: Callable[[], object]) -> None:
        if self._connecting is None:
            self._connecting = asyncio.Semaphore(_CONNECTING)
        task = asyncio.create_task(self._watch(on_news))
        self._tasks.add(task)

    def close(self) -> None:
        """End every watch and their connections, then the thread (what is left after
        ``_CLOSING`` seconds ends with the process: a loaded simulator's thousands of
        watches may take long to cancel)."""
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._cancel(), self._loop).result(_CLOSING)
        except TimeoutError:
            return  # the loop's thread is a daemon
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CLOSING)
        if not self._thread.is_alive():
            self._loop.close()

    async def _cancel(self) -> None:
        """Cancel every watch, again until it ends: Python 3.11's ``asyncio.wait_for``
        loses a cancellation that comes as the awaited read completes (CPython
        gh-86296), and that watch would go on following the counter."""
        while self._tasks:
            for task in self._tasks:
                task.cancel()
            done, _pending = await asyncio.wait(self._tasks, timeout=_RECANCEL)
            self._tasks -= done

    async def _watch(self, on_news: Callable[[], object]) -> None:
        seen: int | None = None
        while True:
            try:
                connection = await self._connect()
            except (OSError, TimeoutError, asyncio.IncompleteReadError, StoreError):
                await asyncio.sleep(_RECONNECT_PAUSE)
                continue
            try:
                seen = await self._follow(connection, seen, on_news)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, StoreError):
                pass  # the scheduler ended (or is relaunched)
            finally:
                connection.writer.close()
            await asyncio.sleep(_RECONNECT_PAUSE)

    async def _connect(self) -> _Connection:
        assert self._connecting is not None
        async with self._connecting:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*self._where),
                                                    _TIMEOUT)
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(reader, writer)
            nonce = secrets.randbits(32)
            writer.write(struct.pack("<BI", Query.VALIDATE, VALIDATION_MAGIC)
                         + struct.pack("<BI", Query.PING, nonce))
            try:
                if await connection.read("<I") != nonce:
                    raise StoreError("not a store")
            except BaseException:
                writer.close()
                raise
            return connection

    async def _follow(self, connection: _Connection, seen: int | None,
                      on_news: Callable[[], object]) -> int | None:
        """``NewsWatch._follow``: wait for each next count until the connection breaks."""
        while True:
            count = await connection.count()
            if count != seen:
                seen = count
                on_news()
                await asyncio.sleep(self._spacing)
                continue  # the counter again: more may have come meanwhile
            if count is None:
                await asyncio.sleep(self._spacing)
            else:
                await connection.wait(news_key(count + 1), self._rearm)
