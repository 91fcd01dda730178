"""The background checkpoint writer, one forked process per saver: a writer *thread* would hold the GIL
while ``torch.save`` pickles and writes, slowing training (docs/checkpoints.md)."""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import pickle
import signal
import socket
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from recovery.ckpt.manifest import CheckpointError
from recovery.ckpt.staging import SharedBuffer, TensorSpec
from recovery.position import TrainPosition

__all__ = ["Write", "WriteRequest", "WriterProcess"]

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl


@dataclass(frozen=True)
class WriteRequest:
    """One checkpoint to write: where the tensors are, the rest of the state, its file name and step
    (the directory is the writer's own)."""

    buffer: SharedBuffer
    specs: list[TensorSpec]
    skeleton: Any
    name: str
    position: TrainPosition


Write = Callable[["WriteRequest", mmap.mmap], object]
"""Writes one request, given the staging buffer mapped; returns what to answer."""


class WriterProcess:
    """The training process's end: at most one write in flight, so the staging buffer is never
    overwritten while being read. ``write`` must be imported before the fork: the child imports
    nothing, since another thread may have held the import lock when it forked."""

    def __init__(self, write: Write) -> None:
        ours, theirs = socket.socketpair()
        # One shared byte: set by the writer as it answers. The training loop looks
        # at it after every step, where polling the pipe would cost a system call each.
        self._answered = mmap.mmap(-1, 1)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the writer process
            try:
                ours.close()
                _become_writer(parent, theirs.fileno())
                _serve(Connection(theirs.detach()), write, self._answered)
            finally:
                os._exit(0)
        theirs.close()
        self.pid = pid
        self._conn = Connection(ours.detach())
        self._pending: str | None = None
        self._finalizer = weakref.finalize(self, _shut_down, self._conn, pid)

    def submit(self, request: WriteRequest, what: str) -> None:
        """Wait for the previous write (raising its error), then send this one."""
        self.wait()
        if not self._finalizer.alive:
            raise CheckpointError(f"writing checkpoint {what} failed: the saver was closed")
        self._answered[0] = 0
        # Plain pickle: Connection.send's pickler copies the copyreg table on every call.
        self._conn.send_bytes(pickle.dumps(request, pickle.HIGHEST_PROTOCOL))
        self._pending = what

    def raise_if_failed(self) -> None:
        """Raise a finished write's error now; never blocks, makes no system call."""
        if self._pending is not None and self._answered[0]:
            self.wait()

    def wait(self) -> None:
        """Wait for the in-flight write; raise CheckpointError if it failed or the writer process died."""
        what, self._pending = self._pending, None
        if what is None:
            return
        try:
            status, detail = self._conn.recv()
        except (EOFError, OSError) as err:
            raise CheckpointError(f"writing checkpoint {what} failed: the writer process {self.pid} died") from err
        if status != "done":
            raise CheckpointError(f"writing checkpoint {what} failed: {detail}") from detail

    def close(self) -> None:
        """Wait for the in-flight write, then stop the process; errors as :meth:`wait`."""
        try:
            self.wait()
        finally:
            self._finalizer()


def _shut_down(conn: Connection, pid: int) -> None:
    conn.close()  # the writer finishes what it is writing, then sees the end of its pipe
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # already reaped (by a subreaper's sweep)


# -- the writer process ----------------------------------------------------------------------


def _become_writer(parent: int, keep_fd: int) -> None:
    """Right after the fork: die with the parent, keep only the pipe, default signals."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)  # the parent died before the prctl took effect
    for signum in signal.valid_signals():
        try:
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            continue
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, os.sysconf("SC_OPEN_MAX"))
    torch.set_num_threads(1)
    # The zip's CRC32 is costly, the manifest's checksum already guards every byte, and
    # torch.load does not check it. Only this process saves this way.
    torch.serialization.set_crc32_options(False)


class _Mapping:
    """The staging buffer as this process maps it, remapped when it is replaced."""

    def __init__(self) -> None:
        self._key: tuple[int, int, int] | None = None
        self._map: mmap.mmap | None = None

    def of(self, buffer: SharedBuffer) -> mmap.mmap:
        key = (buffer.pid, buffer.fd, buffer.generation)
        if key != self._key:
            with open(f"/proc/{buffer.pid}/fd/{buffer.fd}", "r+b") as file:
                self._map = mmap.mmap(file.fileno(), buffer.size)
            self._key = key
        assert self._map is not None
        return self._map


def _picklable(error: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any error can be raised; its text always travels
        return CheckpointError(f"{type(error).__name__}: {error}")
    return error


def _serve(conn: Connection, write: Write, answered: mmap.mmap) -> None:
    mapping = _Mapping()
    while True:
        try:
            request = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        try:
            answer: tuple[str, object] = ("done", write(request, mapping.of(request.buffer)))
        except Exception as err:  # noqa: BLE001 - every failure is the training process's to raise
            logger.exception("background write of checkpoint %s failed", request.name)
            answer = ("failed", _picklable(err))
        # Flag first: once the training process has the answer it may send the next
        # request and clear the flag, which a late set would then mark answered.
        answered[0] = 1
        conn.send(answer)
