"""How a framework callback learns that its process group lost a peer: a collective
raises, or tftrun sends SIGTERM. The signal only sets a flag, acted on at the next hook, so
that the state saved is that of a completed optimizer step.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

__all__ = ["StopRequest", "is_peer_loss", "first_line"]

_PEER_LOSS_MARKERS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "/gloo/transport/",
    "NCCL communicator was aborted",
)
"""Text of the errors gloo and NCCL raise in a collective whose peer is gone."""


def is_peer_loss(error: BaseException) -> bool:
    """Whether ``error`` (or its cause) is a collective failing on a dead peer, or a
    distributed timeout."""
    import torch.distributed as dist  # the launcher imports this package without torch

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, dist.DistError) or (
                isinstance(seen, RuntimeError) and any(m in str(seen) for m in _PEER_LOSS_MARKERS)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def first_line(error: BaseException) -> str:
    """``error``'s type and the first line of its message, for a one-line log."""
    return f"{type(error).__name__}: {next(iter(str(error).splitlines()), '')}"


class StopRequest:
    """SIGTERM, turned into a flag that training polls at its step boundaries; it replaces the
    handler until :meth:`restore`, since Lightning's would run a collective on a dead peer's
    group."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: signal.Handlers | None | object = None
        self._installed = False

    def install(self) -> None:
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True

    def restore(self) -> None:
        """Give SIGTERM back the handler it had (training ended)."""
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)  # type: ignore[arg-type]
            self._installed = False

    def default_action(self) -> None:
        """Give SIGTERM its default action once the last words are written; if one came,
        the process ends of it now."""
        if self._installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._installed = False
        if self.requested:
            signal.raise_signal(signal.SIGTERM)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
