"""A client of torch's c10d ``TCPStore`` in plain Python, for the processes that need no torch.

The supervisor and ``tftctl`` only talk to the scheduler's store; importing torch for that would cost
each a worker's import time and memory. Unlike torch's client (wire protocol: torch 2.13's
``TCPStoreBackend.hpp``), it never blocks past its timeout; after any error the connection is unusable.
"""

from __future__ import annotations

import enum
import secrets
import socket
import struct
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["TCPStoreClient", "StoreError", "StoreTimeout", "ValueTooLarge", "Query",
           "encoded", "encoded_key", "encoded_keys", "READY", "STOP_WAITING", "WAIT_CANCELED",
           "VALIDATION_MAGIC"]

VALIDATION_MAGIC = 0x3C85F7CE


class Query(enum.IntEnum):
    """The request types of torch's store protocol, numbered as torch numbers them."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    DELETE_KEY = 8
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14


READY = 0
"""The answer to ``CHECK`` when every key is set (``CheckResponseType::READY``)."""
STOP_WAITING = 0
"""The answer to ``WAIT`` once every key is set (``WaitResponseType::STOP_WAITING``)."""
WAIT_CANCELED = 1
"""The answer to ``CANCEL_WAIT`` (``WaitResponseType::WAIT_CANCELED``), sent after a
``STOP_WAITING`` when the keys came as the wait was cancelled."""


class StoreError(ConnectionError):
    """The store cannot be reached, or the connection to it broke."""


class StoreTimeout(StoreError):
    """The store did not answer in time (for ``get``: the key was not set in time)."""


class ValueTooLarge(StoreError):
    """A value announced longer than the caller takes (the connection is dropped)."""


KEY_PREFIX = "/"
"""Torch's ``TCPStore`` puts this before every key it sends: ``a`` is ``/a`` on the wire."""


def encoded(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else bytes(value)
    return struct.pack("<Q", len(data)) + data


def encoded_key(key: str) -> bytes:
    return encoded(KEY_PREFIX + key)


def encoded_keys(keys: Sequence[str]) -> bytes:
    return struct.pack("<Q", len(keys)) + b"".join(encoded_key(key) for key in keys)


class TCPStoreClient:
    """One connection to a ``TCPStore`` server, each operation (connecting too) within ``timeout``
    seconds. Not thread-safe: callers share one under a lock. Raises StoreError when nothing accepts
    connections, StoreTimeout when something does but does not answer as a store."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.timeout = timeout
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
        except TimeoutError as err:
            raise StoreTimeout(f"connecting to the store at {host}:{port}: {err}") from None
        except OSError as err:
            raise StoreError(f"connecting to the store at {host}:{port}: {err}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._where = f"{host}:{port}"
        try:
            self._send(struct.pack("<BI", Query.VALIDATE, VALIDATION_MAGIC))
            nonce = secrets.randbits(32)
            self._send(struct.pack("<BI", Query.PING, nonce))
            if self._unpack("<I") != nonce:
                raise StoreError(f"the server at {self._where} is not a store")
        except StoreError:
            self.close()
            raise

    # ----------------------------------------------------------------- operations
    def set(self, key: str, value: str | bytes) -> None:
        self._send(bytes([Query.SET]) + encoded_key(key) + encoded(value))

    def get(self, key: str, limit: int) -> bytes:
        """The value of ``key``, waiting up to the timeout for it to be set (else StoreTimeout);
        ValueTooLarge, none of it read, when its announced length is over ``limit`` (anyone may set any
        key)."""
        self._send(bytes([Query.WAIT]) + encoded_keys([key]))
        if self._unpack("<B") != STOP_WAITING:
            raise StoreError(f"the store at {self._where} answered a wait unexpectedly")
        self._send(bytes([Query.GET]) + encoded_key(key))
        return self._read_value(limit)

    def peek(self, key: str, limit: int) -> bytes | None:
        """The value of ``key``, or ``None`` while it is unset: check, then get, never waiting
        (see :meth:`get` for ``limit``)."""
        return self.get(key, limit) if self.check([key]) else None

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer under ``key`` (0 if unset); the new value."""
        self._send(bytes([Query.ADD]) + encoded_key(key) + struct.pack("<q", amount))
        return int(self._unpack("<q"))

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every one of ``keys`` is set (no waiting)."""
        self._send(bytes([Query.CHECK]) + encoded_keys(keys))
        return self._unpack("<B") == READY

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes,
                    limit: int) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is unset and
        ``expected`` is empty); the value it holds afterwards (see :meth:`get` for
        ``limit``)."""
        self._send(bytes([Query.COMPARE_SET]) + encoded_key(key) + encoded(expected)
                   + encoded(desired))
        return self._read_value(limit)

    def delete_key(self, key: str) -> bool:
        self._send(bytes([Query.DELETE_KEY]) + encoded_key(key))
        return self._unpack("<q") > 0

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        """Wait until every one of ``keys`` is set; False when not within ``timeout`` seconds. The
        connection stays usable either way, and a client blocked here costs the store nothing."""
        self._send(bytes([Query.WAIT]) + encoded_keys(keys))
        self._sock.settimeout(timeout)
        try:
            answer = self._sock.recv(1)
        except TimeoutError:
            answer = None
        except OSError as err:
            self._broken(StoreError, f"receiving: {err}")
        finally:
            if self._sock.fileno() >= 0:
                self._sock.settimeout(self.timeout)
        if answer == b"":
            self._broken(StoreError, "the connection was closed")
        if answer is None:  # given up: the keys may still come before the cancel does
            self._send(bytes([Query.CANCEL_WAIT]))
            answer = self._receive(1)
            came = answer[0] == STOP_WAITING
            if came:  # the cancel's own answer follows
                answer = self._receive(1)
            if answer[0] != WAIT_CANCELED:
                self._broken(StoreError, "it answered a cancelled wait unexpectedly")
            return came
        if answer[0] != STOP_WAITING:
            self._broken(StoreError, "it answered a wait unexpectedly")
        return True

    def queue_push(self, queue: str, value: str | bytes) -> None:
        self._send(bytes([Query.QUEUE_PUSH]) + encoded_key(queue) + encoded(value))

    def close(self) -> None:
        """Close the connection; an operation blocked on it in another thread (a
        :meth:`wait`) ends with a :class:`StoreError`."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # close() alone wakes no blocked recv
        except OSError:
            pass  # not connected any more
        self._sock.close()

    # ----------------------------------------------------------------- the socket
    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except TimeoutError:
            self._broken(StoreTimeout, "sending")
        except OSError as err:
            self._broken(StoreError, f"sending: {err}")

    def _read_value(self, limit: int) -> bytes:
        size = self._unpack("<Q")
        if size > limit:
            self._broken(ValueTooLarge, f"a value of {size} bytes announced (at most "
                                        f"{limit} taken)")
        return self._receive(size)

    def _unpack(self, layout: str) -> int:
        (value,) = struct.unpack(layout, self._receive(struct.calcsize(layout)))
        return int(value)

    def _receive(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            try:
                chunk = self._sock.recv(min(left, 1 << 20))
            except TimeoutError:
                self._broken(StoreTimeout, f"no answer within {self.timeout:g}s")
            except OSError as err:
                self._broken(StoreError, f"receiving: {err}")
            if not chunk:
                self._broken(StoreError, "the connection was closed")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _broken(self, error: type[StoreError], what: str) -> NoReturn:
        """A failed operation leaves the stream mid-message: the connection is unusable."""
        self.close()
        raise error(f"store at {self._where}: {what}")
