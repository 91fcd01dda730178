"""tftrun's signals: the ones that stop the job are queued, SIGCHLD and they wake the loop.

A handler only queues the signal's number; every signal also writes to a pipe the loop sleeps
on, so that a death or a signal is handled at once, not at the next ``--monitor_interval``.
"""

from __future__ import annotations

import os
import queue
import select
import signal
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress

__all__ = ["Wakeup", "handled"]


class Wakeup:
    """The loop's sleep, ended early by a signal or :meth:`wake`."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._read_fd, self._write_fd = read_fd, write_fd
        self.signals: queue.SimpleQueue[int] = queue.SimpleQueue()

    def wake(self) -> None:
        with suppress(BlockingIOError, OSError):
            os.write(self._write_fd, b"\0")

    def wait(self, timeout: float) -> None:
        """Sleep until a signal (SIGCHLD included) or a wake comes, or ``timeout`` passes."""
        readable, _, _ = select.select([self._read_fd], [], [], timeout)
        if readable:
            with suppress(BlockingIOError):
                while os.read(self._read_fd, 512):
                    pass

    def received(self) -> int | None:
        """The first stopping signal received since the last call, if any."""
        try:
            return self.signals.get_nowait()
        except queue.Empty:
            return None


@contextmanager
def handled(signals: Iterable[int]) -> Iterator[Wakeup]:
    """Queue ``signals`` (``--signals_to_handle``) and wake on them and on SIGCHLD; the
    previous handlers come back on exit."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    wakeup = Wakeup(read_fd, write_fd)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    stopping = set(signals)
    previous = {sig: signal.getsignal(sig) for sig in (*stopping, signal.SIGCHLD)}
    for sig in stopping:
        signal.signal(sig, lambda signum, _frame: wakeup.signals.put(signum))
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    try:
        yield wakeup
    finally:
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(read_fd)
        os.close(write_fd)
