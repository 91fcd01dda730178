"""What the scheduler remembers of its answers: for retries, and to clear the store of them.

:class:`KeptReplies` answers a retry under the same request id with the first answer to any request
that changed something, and is persisted, so a request carried out just before a ``kill -9`` is
answered after a relaunch. :class:`SentReplies` lets the scheduler clear the replies no client read.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import Any

__all__ = ["KeptReplies", "SentReplies", "REPLY_KEEP"]

KEPT_REPLIES = 256
"""Replies kept for retries: far more than the requests that change something in the time a
client retries (exit reports, leaves, injections, last-words claims)."""
REPLY_KEEP = 30.0
"""Seconds a reply stays in the store: far above any client's wait for one."""
SENT_REPLIES = 10_000
"""At most this many replies listed: older ones are removed early."""


class KeptReplies:
    """The answers to the latest :data:`KEPT_REPLIES` requests that changed something."""

    def __init__(self) -> None:
        self._replies: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def get(self, rid: str) -> dict[str, Any] | None:
        return self._replies.get(rid)

    def keep(self, rid: str, reply: dict[str, Any]) -> None:
        self._replies[rid] = reply
        while len(self._replies) > KEPT_REPLIES:
            self._replies.popitem(last=False)

    def to_json(self) -> list[list[Any]]:
        return [[rid, reply] for rid, reply in self._replies.items()]

    def load(self, data: list[list[Any]]) -> None:
        """Take over :meth:`to_json`'s output; raises on a malformed entry."""
        replies = OrderedDict((str(rid), dict(reply)) for rid, reply in data)
        self._replies = OrderedDict(list(replies.items())[-KEPT_REPLIES:])


class SentReplies:
    """The request ids whose replies were set in the store, oldest first."""

    def __init__(self) -> None:
        self._sent: deque[tuple[float, str]] = deque()

    def sent(self, rid: str) -> None:
        self._sent.append((time.monotonic(), rid))

    def next_expiry(self) -> float | None:
        """When (monotonic) :meth:`expired` next has an id to return, if any is kept."""
        return self._sent[0][0] + REPLY_KEEP if self._sent else None

    def expired(self) -> list[str]:
        """Remove and return the ids whose replies are to be removed from the store now."""
        oldest = time.monotonic() - REPLY_KEEP
        expired = []
        while self._sent and (self._sent[0][0] < oldest or len(self._sent) > SENT_REPLIES):
            expired.append(self._sent.popleft()[1])
        return expired
