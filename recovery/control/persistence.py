"""The scheduler's persisted state: saved after its decisions, taken over by a relaunched
scheduler, so that a ``kill -9`` loses nothing the workers were told."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from recovery.control.claims import LastWords
from recovery.control.files import StateFile
from recovery.control.inject import InjectionQueue
from recovery.control.membership import Membership
from recovery.control.node_ranks import NodeRanks
from recovery.control.replies import KeptReplies
from recovery.control.scheduler_config import SchedulerConfig

__all__ = ["PERSIST_EVERY", "SAVES_SHARE", "Persistence", "spaced"]

logger = logging.getLogger(__name__)

PERSIST_EVERY = 1.0
"""Seconds between two deferred saves at the least, and between two updates of the state
file's time while only heartbeats come (:meth:`Persistence._keep_fresh`)."""
SAVES_SHARE = 0.02
"""The share of a core the deferred saves may take: a large job's save is long, so they are spaced to
cost at most this. Decisions are still saved before their replies."""


def spaced(least: float, cost: float, share: float) -> float:
    """Seconds between two runs of something periodic that took ``cost`` seconds: at
    least ``least``, and enough that it takes at most ``share`` of a core."""
    return max(least, cost / share)


class Persistence:
    """The part of :class:`recovery.control.scheduler.Scheduler` that saves and reloads its
    state file; the attributes are the scheduler's, set in its ``__init__``."""

    config: SchedulerConfig
    membership: Membership
    injections: InjectionQueue
    last_words: LastWords
    replies: KeptReplies
    node_ranks: NodeRanks
    _state: StateFile
    _saved: str
    _saved_at: float
    _touched_at: float
    _unsaved: bool
    _persist_every: float

    def _reload(self) -> bool:
        """Take over the state a killed scheduler of this job left; True if it did."""
        data = self._state.load()
        if data is None or data.get("run_id") != self.config.run_id:
            return False
        if data.get("finished"):
            # Its node ranks are kept for the job resumed under the same run id: each node's recovery path
            # holds the checkpoints of its own ranks.
            try:
                self.node_ranks = NodeRanks.parse(data.get("node_ranks", {}))
            except (TypeError, ValueError, AttributeError) as err:
                logger.warning("not keeping the node ranks of %s: %r", self._state.path, err)
            return False
        replies = KeptReplies()
        try:  # parsed before the membership is taken over: all or nothing
            injections = InjectionQueue.parse(data.get("injections", []))
            grants = LastWords.parse(data.get("last_words", {}))
            replies.load(data.get("replies", []))
            node_ranks = NodeRanks.parse(data.get("node_ranks", {}))
            problem = self.membership.load(data.get("membership", {}))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            problem = f"it is malformed ({err!r})"
        if problem is not None:
            logger.warning("not reloading %s: %s", self._state.path, problem)
            return False
        self.injections.pending, self.last_words.grants = injections, grants
        self.replies, self.node_ranks = replies, node_ranks
        self._saved = json.dumps(self._snapshot(finished=False), sort_keys=True)
        return True

    def _snapshot(self, finished: bool) -> dict[str, Any]:
        return {"run_id": self.config.run_id, "finished": finished,
                "membership": self.membership.to_json(),
                "injections": self.injections.to_json(),
                "last_words": self.last_words.to_json(),
                "replies": self.replies.to_json(),
                "node_ranks": self.node_ranks.to_json()}

    def _save(self, finished: bool, now: bool = True) -> None:
        """Persist the state when it changed: at once after a decision, else at most every
        :data:`PERSIST_EVERY` seconds, or longer where saves would take more than :data:`SAVES_SHARE` of
        a core (the snapshot is not even built in between)."""
        started = time.monotonic()
        if not now and started - self._saved_at < self._persist_every:
            self._unsaved = True
            return
        self._unsaved = False
        text = json.dumps(self._snapshot(finished), sort_keys=True)
        if text == self._saved:
            return
        self._state.save_text(text)
        self._saved, self._saved_at = text, time.monotonic()
        self._persist_every = spaced(PERSIST_EVERY, self._saved_at - started, SAVES_SHARE)

    def _keep_fresh(self) -> None:
        """Nothing was decided: heartbeats moved only what every next beat repeats, which a relaunched
        scheduler learns again, so the state file (O(members) to encode) is not written. Only its time
        is brought up to date, at most every :data:`PERSIST_EVERY` s: other nodes take a state file
        written lately for a job still alive, and the first batch saves the state before any touch."""
        now = time.monotonic()
        if now - max(self._saved_at, self._touched_at) >= PERSIST_EVERY:
            self._touched_at = now
            self._state.touch()
