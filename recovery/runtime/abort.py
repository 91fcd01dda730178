"""How a wait is told to give up: one ``should_abort()`` callable for every wait. The trainer
answers yes once SIGTERM was noted, so that a rank stuck on a peer's fault still saves its
last words and exits within the launcher's grace period."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ShouldAbort", "Aborted", "never"]

ShouldAbort = Callable[[], bool]
"""Asked between the polls of a wait: True makes the wait raise :class:`Aborted`."""


class Aborted(RuntimeError):
    """A wait gave up because ``should_abort()`` said so."""


def never() -> bool:
    """The default :data:`ShouldAbort`: a wait that nothing interrupts."""
    return False
