"""Wake up on the scheduler's news instead of reading its counter every second.

A :class:`NewsWatch` blocks in a store ``WAIT`` on the next count's key, which costs the store nothing
until it is set (docs/scale.md). The keys are only hints (whoever sets them causes a beat, whose signed
reply is the news), so calls are limited to :data:`BURST` at once, then one per ``spacing``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from recovery.control.rpc import adopt_client, news_key, read_news
from recovery.control.tcpstore_client import StoreError, TCPStoreClient

__all__ = ["BURST", "NewsWatch"]

logger = logging.getLogger(__name__)

_CONNECT_TIMEOUT = 5.0
_RECONNECT_PAUSE = 0.5
BURST = 2
"""Calls the watch makes at once after a quiet while; one more each ``spacing``."""


class NewsWatch:
    """Calls ``on_news`` when the scheduler's news counter moves (and once at the start). ``on_news``
    runs in the watch's thread and must not block; ``spacing``: least seconds between two calls;
    ``rearm``: seconds a wait lasts before the counter is read again, so a key removed by a stranger
    holds no news back for longer."""

    def __init__(self, host: str, port: int, on_news: Callable[[], object],
                 spacing: float, rearm: float = 30.0) -> None:
        self._where = (host, port)
        self._on_news = on_news
        self._spacing = spacing
        self._rearm = rearm
        self._closed = threading.Event()
        self._client: TCPStoreClient | None = None
        self._lock = threading.Lock()  # the client, against close()
        self._thread = threading.Thread(target=self._watch, name="tft-news-watch",
                                        daemon=True)
        self._started = False

    def start(self) -> None:
        """Start watching, if not yet."""
        with self._lock:
            if not self._started and not self._closed.is_set():
                self._started = True
                self._thread.start()

    def close(self) -> None:
        """Stop: a blocked wait ends with its connection."""
        self._closed.set()
        with self._lock:
            if self._client is not None:
                self._client.close()
        if self._started:
            self._thread.join(_CONNECT_TIMEOUT)

    def _watch(self) -> None:
        seen: int | None = None
        while not self._closed.is_set():
            try:
                client = TCPStoreClient(*self._where, _CONNECT_TIMEOUT)
            except StoreError:
                self._closed.wait(_RECONNECT_PAUSE)
                continue
            if not adopt_client(self._lock, self._closed, client, self._use):
                return
            try:
                seen = self._follow(client, seen)
            except StoreError as err:  # the scheduler ended (or is relaunched), or closed
                logger.debug("news watch: %s", err)
            client.close()
            self._closed.wait(_RECONNECT_PAUSE)

    def _use(self, client: TCPStoreClient) -> None:
        self._client = client

    def _follow(self, client: TCPStoreClient, seen: int | None) -> int | None:
        """Wait for each next count on ``client`` until it breaks (StoreError)."""
        calls, since = float(BURST), time.monotonic()  # a bucket of calls, one more a spacing
        while not self._closed.is_set():
            count = read_news(client)
            if count != seen:
                now = time.monotonic()
                calls, since = min(float(BURST), calls + (now - since) / self._spacing), now
                if calls < 1:
                    if self._closed.wait((1 - calls) * self._spacing):
                        break
                    continue  # the counter again: more may have come meanwhile
                seen, calls = count, calls - 1
                self._on_news()
                continue
            if count is None:  # not a number (a stranger's) until the scheduler resets it:
                self._closed.wait(self._spacing)  # read it every spacing
            else:
                client.wait([news_key(count + 1)], self._rearm)
        return seen
