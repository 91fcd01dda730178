"""The stop signals a trainer notes while training, to act on once the step is over."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["STOP_PATIENCE", "STOP_SIGNALS", "StopRequest", "StopSignals"]

STOP_PATIENCE = 1.0
"""Seconds a noted stop signal leaves a wait before it gives up: peers stopped at the same
moment still complete the step's collective; a collective stuck on a frozen peer is left."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                signal.SIGUSR2)
"""The signals that stop training in order (tftrun's default ``--signals_to_handle``);
all but SIGTERM only where the script did not handle them itself."""


@dataclass(frozen=True)
class StopRequest:
    """A stop signal the handler noted, and when (``time.monotonic()``)."""

    signum: int
    at: float


class StopSignals:
    """The first stop signal noted while training, if any: the handler only notes it; the
    trainer acts on it after the step, or a wait gives up on it (:meth:`should_abort`) when
    the step cannot complete."""

    def __init__(self) -> None:
        self.request: StopRequest | None = None

    def should_abort(self) -> bool:
        """Whether a wait should give up: a stop signal was noted :data:`STOP_PATIENCE` ago."""
        request = self.request
        return request is not None and time.monotonic() - request.at >= STOP_PATIENCE

    @contextlib.contextmanager
    def noted(self) -> Iterator[None]:
        """While inside, a stop signal is noted instead of acted on: SIGTERM, and each of
        :data:`STOP_SIGNALS` the script left to its default; only the main thread can set handlers."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def note(signum: int, _frame: Any) -> None:
            if self.request is None:
                self.request = StopRequest(signum, time.monotonic())

        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        noted = [sig for sig, handler in previous.items()
                 if sig == signal.SIGTERM or handler in (signal.SIG_DFL, signal.default_int_handler)]
        for sig in noted:
            signal.signal(sig, note)
        try:
            yield
        finally:
            for sig in noted:
                signal.signal(sig, previous[sig])
