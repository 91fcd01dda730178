"""The supervisor's warm spares (``--warm_spare=N``): kept started, handed a relaunched rank.

A relaunched rank's cold start (``python``, ``import torch``, the first optimizer) is
most of a per-rank recovery. A spare (launcher/procs/spare.py) has paid it ahead; handing it
the rank is a JSON message on a pipe. See docs/warm-spare.md.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from launcher.procs.process import Child, open_log, stop_all
from launcher.procs.spec import ProcessSpec

__all__ = ["Spare", "SparePool", "SPARE_DELAY", "resident_mib"]

SPARE_DELAY = 5.0
"""Seconds between the need for a spare (the workers' start, a hand-over, an idle spare's
death) and starting it: a cold start competes for the cores with the job's launch or
with the recovery that just used a spare."""


@dataclass
class Spare:
    """A started spare and the write end of the pipe it waits on."""

    child: Child
    serial: int
    go_fd: int

    def hand_over(self, spec: ProcessSpec, argv: tuple[str, ...], header: str) -> bool:
        """Make the spare ``spec``'s worker; False when it is gone (it was not handed over).

        The header goes into the worker's log first, as for a spawned worker.
        """
        with open_log(spec.log_path, header):
            pass
        message = {"env": dict(spec.env), "argv": list(argv), "cwd": os.getcwd(),
                   "log": str(spec.log_path)}
        try:
            with os.fdopen(self.go_fd, "wb") as pipe:
                pipe.write(json.dumps(message).encode())
        except BrokenPipeError:
            return False
        finally:
            self.go_fd = -1
        return True

    def retire(self) -> None:
        """Close the pipe: an idle spare reads EOF and exits 0."""
        if self.go_fd >= 0:
            os.close(self.go_fd)
            self.go_fd = -1


class SparePool:
    """Keeps ``size`` spares started, each no sooner than ``delay`` after it was needed.

    ``start(read_fd, serial)`` starts one spare process on its end of a fresh pipe.
    """

    def __init__(self, size: int, start: Callable[[int, int], Child],
                 delay: float = SPARE_DELAY) -> None:
        self._size = size
        self._start = start
        self._delay = delay
        self._idle: list[Spare] = []
        self._due: list[float] = []
        """Monotonic times at which the missing spares are to be started."""
        self._started = 0

    @property
    def size(self) -> int:
        return self._size

    def keep(self, size: int) -> None:
        """From now on keep ``size`` spares; the missing ones are due at once (the
        automatic spare starts when it becomes useful, not ``delay`` later)."""
        now = time.monotonic()
        self._due.extend([now] * (size - self._size))
        self._size = size

    def tend(self) -> list[tuple[Spare, int]]:
        """Forget idle spares that died (returned with their returncodes), plan their
        replacements and those of spares handed over, and start the spares now due."""
        dead = [(s, rc) for s in self._idle if (rc := s.child.poll()) is not None]
        for spare, _ in dead:
            spare.retire()
            self._idle.remove(spare)
        now = time.monotonic()
        self._due.extend([now + self._delay] * (self._size - len(self._idle) - len(self._due)))
        while self._due and self._due[0] <= now:
            self._due.pop(0)
            self._idle.append(self._spawn())
        return dead

    def _spawn(self) -> Spare:
        read_fd, write_fd = os.pipe()
        try:
            child = self._start(read_fd, self._started)
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        self._started += 1
        return Spare(child, self._started - 1, write_fd)

    def hand_over(self, spec: ProcessSpec, argv: tuple[str, ...], header: str) -> Child | None:
        """Make an idle spare ``spec``'s worker; its Child, or None when no spare could be.

        A spare that died unseen fails its hand-over and is reaped here; the caller then
        spawns the worker (its log holds two headers for this launch). A spare whose
        hand-over raised (the worker's log cannot be opened) is killed before it raises on.
        """
        spare = next((s for s in self._idle if s.child.poll() is None), None)
        if spare is None:
            return None
        self._idle.remove(spare)
        handed = False
        try:
            handed = spare.hand_over(spec, argv, header)
        finally:
            if not handed:  # gone, or the worker's log could not be opened (OSError)
                spare.retire()
                stop_all([spare.child], signal.SIGKILL, 0)
        return spare.child if handed else None

    def describe(self) -> str:
        """The idle spares and what they cost, for the live view: ``1 warm spare: pid 12
        (290 MiB resident)``; empty without spares."""
        alive = [s for s in self._idle if s.child.poll() is None]
        if not alive:
            return ""
        sizes = ", ".join(f"pid {s.child.pid} ({_mib(resident_mib(s.child.pid))} resident)"
                          for s in alive)
        return f"{len(alive)} warm spare{'s' if len(alive) > 1 else ''}: {sizes}"

    def retire_all(self) -> list[Spare]:
        """Retire every idle spare (it reads EOF and exits 0) and forget the pool's plans;
        the spares are returned for the caller to stop and reap."""
        idle, self._idle, self._due = self._idle, [], []
        for spare in idle:
            spare.retire()
        return idle

    def stop(self, sig: int, grace_period: float) -> list[tuple[Spare, int]]:
        """Stop every idle spare (retired, then ``sig``); each with its returncode."""
        idle = self.retire_all()
        stop_all([s.child for s in idle], sig, grace_period)
        return [(s, s.child.process.returncode) for s in idle]


def resident_mib(pid: int) -> float | None:
    """The resident memory of process ``pid`` in MiB (``VmRSS``); None when unknown."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _mib(value: float | None) -> str:
    return "? MiB" if value is None else f"{value:.0f} MiB"
