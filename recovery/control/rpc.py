"""Requests to the scheduler over its c10d ``TCPStore``, and a client that survives its death.

The store's own operations are the wire protocol, so no second port or server is needed
(docs/protocol.md); a retry under the same ``rid`` gets the first attempt's reply. Workers beat early
when the :data:`NEWS` counter moves, a hint only: the news is the beat's signed reply.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from enum import Enum
from typing import Any

from recovery import env as names
from recovery.control.nodes import stored_at
from recovery.control.signing import (
    BadSignature,
    Kind,
    job_key,
    keyed_name,
    new_nonce,
    open_value,
    seal,
    sign_value,
    unseal,
)
from recovery.control.tcpstore_client import StoreError, StoreTimeout, TCPStoreClient
from recovery.control.throttle import Throttle

__all__ = ["Op", "REQUESTS", "NEWS", "MAX_NEWS_BYTES", "news_key", "read_news", "reply_key", "ready_key",
           "ready_at", "ready_value", "ready_ranks", "generation_prefix", "SchedulerLink", "adopt_client",
           "SchedulerUnavailable", "NoReply", "UnverifiedReply", "listen_on", "new_request_id", "open_client",
           "port_open"]

logger = logging.getLogger(__name__)

REQUESTS = "tft/requests"
MAX_REPLY_BYTES = 8 << 20
"""A reply announced larger than this is nobody's (a status of thousands of members is
far smaller): its connection is dropped before the value is read."""
NEWS = "tft/news"
"""The news counter (see the module docstring)."""
_RECONNECT_PAUSE = 0.1
_CLOSED_POLL = 0.05
"""Seconds between two looks at whether a link waiting to connect was closed."""
MAX_NEWS_BYTES = 65_536
"""The news counter is a few digits; a stranger's value up to this is read and ignored
(a longer one costs the connection)."""
_PROBE_TIMEOUT = 1.0


class Op(str, Enum):
    """What a request asks of the scheduler."""

    REGISTER = "register"
    HEARTBEAT = "heartbeat"
    NODE_BEAT = "node_beat"
    LEAVE = "leave"
    EXIT = "exit"
    INJECT = "inject"
    LAST_WORDS = "last_words"
    STATUS = "status"
    TICK = "tick"
    NODE_RANK = "node_rank"
    RETIRE = "retire"
    JOB = "job"
    PEER_FAILED = "peer_failed"


def news_key(count: int) -> str:
    """Set by the scheduler when :data:`NEWS` reaches ``count``: a supervisor waits for
    the key of the next count instead of reading the counter (recovery/control/news_watch.py)."""
    return f"{NEWS}/{count}"


def read_news(client: TCPStoreClient) -> int | None:
    """The :data:`NEWS` counter (0 while unset; ``None``: not a number); raises StoreError. Peeked, not
    add(0): anyone may set it to a non-number, and the store then drops a connection that adds to it,
    requests in flight included."""
    news = client.peek(NEWS, MAX_NEWS_BYTES)
    if news is None:
        return 0
    try:
        return int(news)
    except ValueError:
        return None


def reply_key(rid: str) -> str:
    return f"tft/reply/{rid}"


def ready_key(generation: int) -> str:
    """Set by the scheduler once ``generation`` is formed: its members may rendezvous. Its
    value is ``generation`` and its members' ranks, signed with the job's key
    (:func:`ready_value`)."""
    return f"tft/ready/{generation}"


def ready_at(key: bytes, generation: int) -> str:
    """Where :func:`ready_value` is kept: under a name only the job can compute
    (recovery/control/nodes.py ``stored_at``), so that a stranger who overwrites
    :func:`ready_key` keeps no member waiting."""
    return stored_at(key, ready_key(generation))


def ready_value(key: bytes, generation: int, ranks: list[int]) -> str:
    """``generation:r0,r1,...``: the generation and the ranks of its members, ascending."""
    return sign_value(key, ready_key(generation), f"{generation}:{','.join(map(str, ranks))}")


def ready_ranks(key: bytes, generation: int, stored: bytes) -> list[int] | None:
    """The members' ranks if ``stored`` is the scheduler's :func:`ready_value` of
    ``generation``; ``None`` otherwise."""
    try:
        value = open_value(key, ready_key(generation), stored)
    except BadSignature:
        return None
    number, _, ranks = value.partition(":")
    if number != str(generation):
        return None
    return [int(rank) for rank in ranks.split(",") if rank]


def generation_prefix(key: bytes, generation: int) -> str:
    """The store prefix under which the members of ``generation`` rendezvous (their
    arrival keys, then torch's own): a MAC of the generation keyed with the job's key,
    which nobody without the token can compute ahead of them."""
    return f"gen{generation}-{keyed_name(key, f'generation {generation}')}/"


class SchedulerUnavailable(ConnectionError):
    """The scheduler cannot be reached now (down, being relaunched, or not started yet)."""


class NoReply(SchedulerUnavailable):
    """The request was sent but not answered in time: it may still be carried out. Ask
    again under the same request id to learn what came of it."""


class UnverifiedReply(NoReply):
    """A reply came that does not verify with this process's token: ignored. ``claimed``
    is the reason it claims (unverified), e.g. ``token`` in the scheduler's refusal of a
    request signed with another token."""

    def __init__(self, message: str, claimed: str | None) -> None:
        super().__init__(message)
        self.claimed = claimed


def new_request_id() -> str:
    return uuid.uuid4().hex


def open_client(host: str, port: int, timeout: float) -> Any:
    """A new torch store client of ``host:port``, for a process group to rendezvous
    through; blocks while the port is not served."""
    from torch.distributed import TCPStore

    return TCPStore(host, port, is_master=False, wait_for_workers=False,
                    timeout=timedelta(seconds=timeout))


def listen_on(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` only (0: a free port); raises OSError. Torch's libuv store
    listens on every interface whatever host it is given; one hosted on this socket
    (``master_listen_fd``) listens only where the socket does."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def describe_bind_error(err: OSError) -> str:
    return "already in use" if err.errno == errno.EADDRINUSE else (err.strerror or str(err))


def port_open(host: str, port: int) -> bool:
    """Whether something accepts connections on ``host:port`` (a plain, silent probe)."""
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT):
            return True
    except OSError:
        return False


def adopt_client(lock: threading.Lock, closed: threading.Event, client: TCPStoreClient,
                 use: Callable[[TCPStoreClient], object]) -> bool:
    """Hand a newly made ``client`` to ``use`` under ``lock``, unless ``closed`` was set
    while it was being made: then it is closed. Whether it was handed over (a
    ``close()`` that takes ``lock`` then closes it)."""
    with lock:
        if closed.is_set():
            client.close()
            return False
        use(client)
        return True


def _claimed_reason(err: Exception) -> str | None:
    """The ``reason`` an unverified reply claims, if it has a readable one."""
    header = err.header if isinstance(err, BadSignature) else None
    try:
        reason = None if header is None else json.loads(header.body).get("reason")
    except (ValueError, AttributeError, RecursionError):
        return None
    return reason if isinstance(reason, str) else None


class SchedulerLink:
    """A store client of the scheduler that reconnects by itself (not ``connect``: from :meth:`start`).
    ``token``, ``run_id`` and ``epoch`` make the job's key, never sent, which signs requests and
    verifies replies; a joining node, which does not know the job yet, passes ``key`` instead."""

    def __init__(self, host: str, port: int, token: str, reply_timeout: float,
                 on_connect: Callable[[], object] | None = None, connect: bool = True,
                 run_id: str = names.DEFAULT_RUN_ID, epoch: str = "",
                 key: bytes | None = None) -> None:
        self.host = host
        self.port = port
        self._key = job_key(token, run_id, epoch) if key is None else key
        self.unverified = 0
        """Replies that failed their check (forged, or signed with another token)."""
        self._unverified_log = Throttle()
        self._reply_timeout = reply_timeout
        self._on_connect = on_connect
        self._client: TCPStoreClient | None = None
        self._abandoned: list[str] = []
        """Request ids whose replies this link stopped waiting for: removed from the
        store once a later request is answered."""
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._closed = threading.Event()
        self._connector: threading.Thread | None = None
        self._connector_lock = threading.Lock()
        if connect:
            self.start()

    def call(self, op: Op, rid: str | None = None, **fields: Any) -> dict[str, Any]:
        """Send one request and return the scheduler's reply. Raises NoReply when none came within the
        reply timeout (it may come later: ask again under the same ``rid``), SchedulerUnavailable when
        not connected or the connection broke (a new one is made in the background)."""
        rid, nonce = rid or new_request_id(), new_nonce()
        request = seal(self._key, Kind.REQUEST, op.value, rid, nonce, json.dumps(fields))
        with self._lock:
            client = self._client
            if client is None:
                raise SchedulerUnavailable(f"no connection to the scheduler at {self.where}")
            try:
                client.queue_push(REQUESTS, request)
                reply = self._reply_to(client, op, rid, nonce)
                self._clear_abandoned(client)
            except StoreError as err:
                # A timed-out connection is mid-message: a new one is made, and its
                # on_connect delivers what waits for it (SchedulerControl's exit reports),
                # under the same request ids.
                self._drop()
                if isinstance(err, StoreTimeout):
                    self._abandoned.append(rid)
                    raise NoReply(f"no answer to {op.value} from the scheduler at "
                                  f"{self.where} within {self._reply_timeout:g}s") from None
                raise SchedulerUnavailable(f"scheduler at {self.where}: {err}") from None
        return self._verified(op, rid, nonce, reply)

    @property
    def key(self) -> bytes:
        """The job's key (recovery/control/signing.py): what this link signs with."""
        return self._key

    def _reply_to(self, client: TCPStoreClient, op: Op, rid: str, nonce: str) -> bytes:
        """The reply under ``rid``'s key that answers this attempt; a signed reply to an
        earlier attempt of the same request (it came after that attempt stopped waiting)
        is removed and waited past, up to the reply timeout, not taken for a forgery."""
        deadline = time.monotonic() + self._reply_timeout
        while True:
            # get waits for the key, up to the client's timeout (the reply timeout).
            reply = client.get(reply_key(rid), MAX_REPLY_BYTES)
            client.delete_key(reply_key(rid))
            if not self._earlier_attempt(op, rid, nonce, reply) or time.monotonic() > deadline:
                return reply

    def _earlier_attempt(self, op: Op, rid: str, nonce: str, raw: bytes) -> bool:
        try:
            sealed = unseal(self._key, Kind.REPLY, raw, MAX_REPLY_BYTES)
        except BadSignature:
            return False
        return (sealed.op, sealed.rid) == (op.value, rid) and sealed.nonce != nonce

    def news(self) -> int | None:
        """The scheduler's news counter (:func:`read_news`); ``None`` also when it cannot be
        read now (not connected, or the connection broke)."""
        with self._lock:
            client = self._client
            if client is None:
                return None
            try:
                return read_news(client)
            except StoreError:
                self._drop()
                return None

    def _verified(self, op: Op, rid: str, nonce: str, raw: bytes) -> dict[str, Any]:
        """The reply in ``raw`` when it is the scheduler's answer to this very attempt."""
        try:
            sealed = unseal(self._key, Kind.REPLY, raw, MAX_REPLY_BYTES)
            if (sealed.op, sealed.rid, sealed.nonce) != (op.value, rid, nonce):
                raise BadSignature("it answers another request")
            reply = json.loads(sealed.body)
            if not isinstance(reply, dict):
                raise BadSignature("not a JSON object")
        except (BadSignature, ValueError) as err:
            self.unverified += 1
            claimed = _claimed_reason(err)
            if (count := self._unverified_log.note()) is not None:
                logger.warning("ignored %d reply(s) from the store at %s that did not verify "
                               "(latest: %s, to %s%s)", count, self.where, err, op.value,
                               "" if claimed is None else f", claiming {claimed!r}")
            raise UnverifiedReply(f"the reply to {op.value} from {self.where} did not verify: "
                                  f"{err}", claimed) from None
        return reply

    def call_until(self, op: Op, deadline: float, **fields: Any) -> dict[str, Any]:
        """Ask, under one request id so that it is carried out at most once, until the scheduler
        answers or ``deadline`` (``time.monotonic()``) passes; then raises SchedulerUnavailable."""
        rid = new_request_id()
        while (left := deadline - time.monotonic()) > 0:
            if not self.wait_connected(left):
                break
            try:
                return self.call(op, rid=rid, **fields)
            except SchedulerUnavailable as err:
                logger.debug("asking the scheduler again (%s)", err)
        raise SchedulerUnavailable(f"no answer to {op.value} from the scheduler at "
                                   f"{self.where} in time")

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    def wait_connected(self, timeout: float) -> bool:
        """Whether connected, waiting up to ``timeout`` seconds for it; False soon after
        :meth:`close` (a thread waiting here must not hold up its owner's exit)."""
        deadline = time.monotonic() + timeout
        while not self._closed.is_set():
            left = deadline - time.monotonic()
            if self._connected.wait(max(0.0, min(left, _CLOSED_POLL))):
                return True
            if left <= _CLOSED_POLL:
                return False
        return False

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            self._drop()  # connects no more once closed

    def _drop(self) -> None:
        """Forget a broken client and start making a new one."""
        if self._client is not None:
            self._client.close()
        self._client = None
        self._connected.clear()
        self.start()

    def start(self) -> None:
        """Start connecting in the background, if not yet (see ``connect``)."""
        with self._connector_lock:
            if self._connector is None and not self._closed.is_set():
                self._connector = threading.Thread(target=self._connect,
                                                   name="tft-scheduler-link", daemon=True)
                self._connector.start()

    def _connect(self) -> None:
        """Make clients until one stays connected (``on_connect`` may find it broken)."""
        while not self._closed.is_set():
            if not self._connected.is_set():
                client = self._open()
                if client is None:
                    self._closed.wait(_RECONNECT_PAUSE)
                    continue
                if not adopt_client(self._lock, self._closed, client, self._use):
                    return
                if self._on_connect is not None:
                    self._on_connect()
            with self._connector_lock:
                if self._connected.is_set() or self._closed.is_set():
                    self._connector = None
                    return

    def _use(self, client: TCPStoreClient) -> None:
        self._client = client
        self._connected.set()

    def _clear_abandoned(self, client: TCPStoreClient) -> None:
        """Remove the replies of the requests given up on: a later request is answered,
        so theirs are set (a request that got none, a replay, has none to remove)."""
        while self._abandoned:
            client.delete_key(reply_key(self._abandoned[-1]))
            self._abandoned.pop()

    def _open(self) -> TCPStoreClient | None:
        if not port_open(self.host, self.port) or self._closed.is_set():
            return None
        try:
            return TCPStoreClient(self.host, self.port, self._reply_timeout)
        except StoreError as err:
            logger.debug("connecting to the scheduler at %s: %s", self.where, err)
            return None
