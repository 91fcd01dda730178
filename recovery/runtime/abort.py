"""How a wait is told to give up: one ``should_abort()`` callable for every wait.

A worker waits in several places where a peer's fault can hold it for a long time: the
polls of a collective, the meeting of a new generation's members, the wait for the
scheduler to form a newer generation. Each of them takes a :data:`ShouldAbort` and asks
it between polls; when it says yes, the wait raises :class:`Aborted`. The trainer answers
yes once a stop signal (SIGTERM) has been noted, so that a stuck rank still saves its
last words and exits within the launcher's grace period.
"""

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
