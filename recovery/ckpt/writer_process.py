"""The background checkpoint writer: a process of its own, one per saver.

A writer *thread* holds the GIL while ``torch.save`` pickles, hashes and writes, and that
slows the training loop it shares the interpreter with. So the training process only
stages the state in shared memory (:mod:`recovery.ckpt.staging`) and sends a small
message over a pipe; this process rebuilds the state and writes it exactly as a
synchronous save would (:func:`recovery.ckpt.checkpoint.write_checkpoint`: durable,
hashed, listed in the manifest, the oldest pruned), then answers ``done`` or the error.

It is started once (``python -m recovery.ckpt.writer_process FD``) and says ``ready``
once it has imported torch (until then the saver writes synchronously rather than wait
for it), runs at a lower CPU priority, and never outlives the training process: it gets ``SIGKILL`` when the thread
that started it ends (``PR_SET_PDEATHSIG``), which leaves at most a temporary file that
the next saver removes, and it exits when its pipe closes.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import pickle
import signal
import socket
import subprocess
import sys
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import recovery
from recovery.ckpt.manifest import CheckpointError, KeepRule
from recovery.ckpt.staging import SharedBuffer, TensorSpec
from recovery.position import TrainPosition

__all__ = ["WriteRequest", "WriterProcess"]

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl
_NICENESS = 10


@dataclass(frozen=True)
class WriteRequest:
    """One checkpoint to write: where the tensors are, the rest of the state, where it
    goes, and the saver's keep rule."""

    buffer: SharedBuffer
    specs: list[TensorSpec]
    skeleton: Any
    directory: Path
    name: str
    position: TrainPosition
    keep: KeepRule


class WriterProcess:
    """The training process's end: at most one write in flight.

    A new write first waits for the previous one, so the staging buffer is never
    overwritten while being read. When the object is collected, or the interpreter
    exits, the pipe is closed and the process waited for: an in-flight write finishes.
    """

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(Path(recovery.__file__).resolve().parent.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
        parent = os.getpid()
        with theirs:
            self._popen = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                preexec_fn=lambda: _die_with(parent),
            )
        self._conn = Connection(ours.detach())
        self._pending: str | None = None
        self._ready = False
        self._finalizer = weakref.finalize(self, _shut_down, self._conn, self._popen)

    @property
    def pid(self) -> int:
        return self._popen.pid

    def ready(self, timeout: float = 0.0) -> bool:
        """Whether the process is up to take writes; waits at most ``timeout`` seconds.

        Raises:
            CheckpointError: it died before it was ready.
        """
        if not self._ready and self._conn.poll(timeout):
            try:
                self._ready = self._conn.recv() == ("ready", None)
            except (EOFError, OSError) as err:
                raise CheckpointError(f"the checkpoint writer process {self._popen.pid} died "
                                      f"before it was ready ({self._popen.poll()})") from err
        return self._ready

    def submit(self, request: WriteRequest, what: str) -> None:
        """Wait for the previous write (raising its error), then send this one."""
        self.wait()
        if not self._finalizer.alive:
            raise CheckpointError(f"writing checkpoint {what} failed: the saver was closed")
        self._conn.send(request)
        self._pending = what

    def raise_if_failed(self) -> None:
        """Raise a finished write's error now; never blocks."""
        if self._pending is not None and self._conn.poll(0):
            self.wait()

    def wait(self) -> None:
        """Wait for the in-flight write.

        Raises:
            CheckpointError: it failed, or the writer process died.
        """
        what, self._pending = self._pending, None
        if what is None:
            return
        try:
            status, detail = self._conn.recv()
        except (EOFError, OSError) as err:
            raise CheckpointError(f"writing checkpoint {what} failed: the writer process "
                                  f"{self._popen.pid} died ({self._popen.poll()})") from err
        if status != "done":
            raise CheckpointError(f"writing checkpoint {what} failed: {detail}") from detail

    def close(self) -> None:
        """Wait for the in-flight write, then stop the process; errors as :meth:`wait`."""
        try:
            self.wait()
        finally:
            self._finalizer()


def _shut_down(conn: Connection, popen: subprocess.Popen[bytes]) -> None:
    conn.close()  # the writer finishes what it is writing, then sees the end of its pipe
    try:
        popen.wait(timeout=600)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def _die_with(parent_pid: int) -> None:
    """Runs in the child between fork and exec: no allocation, no locks, no logging."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


# -- the writer process ----------------------------------------------------------------------


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


def _write(request: WriteRequest, mapping: _Mapping) -> list[str]:
    # Imported here: recovery.ckpt.checkpoint imports this module for WriterProcess.
    from recovery.ckpt.checkpoint import write_checkpoint
    from recovery.ckpt.manifest import Manifest
    from recovery.ckpt.staging import rebuild

    state = rebuild(mapping.of(request.buffer), request.specs, request.skeleton)
    return write_checkpoint(request.directory, request.name, state, request.position,
                            Manifest(request.directory), keep=request.keep)


def _picklable(error: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any error can be raised; its text always travels
        return CheckpointError(f"{type(error).__name__}: {error}")
    return error


def main(fd: int) -> None:
    import torch

    torch.set_num_threads(1)
    os.nice(_NICENESS)  # training comes first; this runs in what it leaves idle
    conn = Connection(fd)
    mapping = _Mapping()
    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("done", _write(request, mapping)))
        except Exception as err:  # noqa: BLE001 - every failure is the training process's to raise
            logger.exception("background write of checkpoint %s failed", request.directory / request.name)
            conn.send(("failed", _picklable(err)))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="[tftrun ckpt writer] %(levelname)s %(message)s")
    main(int(sys.argv[1]))
