"""Stragglers: which rank's compute time per step stays above its peers', free of I/O.

Each rank sends with its heartbeat the median compute time of its steps since its last beat
(:class:`StepTimes`). A :class:`StragglerDetector` names a rank whose time stays at least ``factor``
times its peers' median for ``window`` steps in a row, once, until it falls back (docs/stragglers.md).
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from recovery import env as names

__all__ = ["DEFAULT_FACTOR", "DEFAULT_WINDOW", "POLICIES", "StragglerSettings", "Straggler",
           "StragglerDetector", "StepTimes", "merge_summaries"]

DEFAULT_FACTOR = 1.5
DEFAULT_WINDOW = 20
POLICIES = ("report", "evict")


@dataclass(frozen=True)
class StragglerSettings:
    """``factor``: how many times its peers' median a straggler's step time is at least;
    ``window``: for how many steps in a row; ``policy``: ``report`` (tell) or ``evict``."""

    factor: float = DEFAULT_FACTOR
    window: int = DEFAULT_WINDOW
    policy: str = POLICIES[0]

    def problem(self) -> str | None:
        """Why these settings are invalid, or ``None``."""
        if not self.factor > 1:
            return f"--straggler_factor must be above 1, got {self.factor:g}"
        if self.window < 1:
            return f"--straggler_window must be at least 1 step, got {self.window}"
        if self.policy not in POLICIES:
            return f"--straggler_policy must be one of {', '.join(POLICIES)}, got {self.policy!r}"
        return None

    def to_env(self) -> dict[str, str]:
        return {names.TFT_STRAGGLER_FACTOR: str(self.factor),
                names.TFT_STRAGGLER_WINDOW: str(self.window),
                names.TFT_STRAGGLER_POLICY: self.policy}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StragglerSettings:
        return cls(float(env.get(names.TFT_STRAGGLER_FACTOR) or DEFAULT_FACTOR),
                   int(env.get(names.TFT_STRAGGLER_WINDOW) or DEFAULT_WINDOW),
                   env.get(names.TFT_STRAGGLER_POLICY) or POLICIES[0])


@dataclass(frozen=True)
class Straggler:
    """A rank named a straggler: its step time and its peers' median (seconds), and the
    global step from which its time has stayed above the threshold."""

    rank: int
    step_time: float
    median: float
    since: int


@dataclass
class _Run:
    since: int
    steps: int


class StragglerDetector:
    """The latest step-time summary of each rank, and the stragglers they show."""

    def __init__(self, settings: StragglerSettings) -> None:
        self.settings = settings
        self.latest: dict[int, float] = {}
        self.named: dict[int, Straggler] = {}
        """The ranks named and not yet back under the threshold."""
        self._runs: dict[int, _Run] = {}

    def heard(self, rank: int, step: int, step_time: float, steps: int) -> Straggler | None:
        """Rank ``rank`` ran ``steps`` steps up to global step ``step`` in a median of
        ``step_time`` seconds each; the straggler it is now, if this names it (once)."""
        self.latest[rank] = step_time
        peers = [time for other, time in self.latest.items() if other != rank]
        if not peers:
            return None
        median = statistics.median(peers)
        if step_time < self.settings.factor * median:
            self._runs.pop(rank, None)
            self.named.pop(rank, None)
            return None
        run = self._runs.setdefault(rank, _Run(since=step - steps + 1, steps=0))
        run.steps += steps
        if run.steps < self.settings.window or rank in self.named:
            return None
        straggler = self.named[rank] = Straggler(rank, step_time, median, run.since)
        return straggler

    def warming_up(self, rank: int, step_time: float) -> None:
        """Rank ``rank``'s new process sent its first summary, which holds its warm-up:
        never a straggler's, but its median is its peers' reference from now on rather than a beat later."""
        self.forget(rank)
        self.latest[rank] = step_time

    def reset(self) -> None:
        """A new generation: each rank's share of the step may have changed, so no time
        before it is compared with one after."""
        self.latest.clear()
        self._runs.clear()
        self.named.clear()

    def forget(self, rank: int) -> None:
        """Rank ``rank``'s process ended: its times say nothing of its next one."""
        self.latest.pop(rank, None)
        self._runs.pop(rank, None)
        self.named.pop(rank, None)


def merge_summaries(first: tuple[int, int] | None, second: tuple[int, int]) -> tuple[int, int]:
    """Two summaries (median microseconds, steps) as one: the median of the larger
    share, over both counts (a node's supervisor merges its rank's beats between two
    node beats)."""
    if first is None:
        return second
    median = first[0] if first[1] > second[1] else second[0]
    return median, first[1] + second[1]


class StepTimes:
    """A rank's compute times since its last beat (thread-safe: the training loop adds,
    the heartbeat thread takes), and whether the scheduler should hear of them at once."""

    def __init__(self, settings: StragglerSettings | None = None) -> None:
        self._settings = settings or StragglerSettings()
        self._times: list[float] = []
        self._recent: deque[float] = deque(maxlen=self._settings.window)
        self._before: deque[float] = deque(maxlen=self._settings.window)
        """The ``window`` steps before :attr:`_recent`: the rank's own pace."""
        self._seen = 0
        self._paced = False
        self._urgent = False
        self._lock = threading.Lock()

    def add(self, seconds: float) -> bool:
        """Add one step's time; True when the summary should go out now rather than with the next beat:
        for the ``window`` steps after ``window`` of warm-up (the peers' reference), and at a change of
        pace by ``factor`` either way, summarized alone so that no stale pace stays the reference."""
        window, recent, before = self._settings.window, self._recent, self._before
        with self._lock:
            self._seen += 1
            if self._seen <= window:
                return False
            self._times.append(seconds)
            if len(recent) == window:
                before.append(recent[0])
            recent.append(seconds)
            if len(recent) < window:
                return False
            if not self._paced:  # its first pace
                self._paced = self._urgent = True
                return True
            if len(before) < window or not _changed(statistics.median(recent),
                                                    statistics.median(before), self._settings.factor):
                return False
            self._times = list(recent)
            before.extend(recent)  # the new pace
            recent.clear()
            self._urgent = True
            return True

    def take(self) -> tuple[int, int, bool] | None:
        """The median (microseconds) and count of the times since the last take, and
        whether :meth:`add` asked for them to go out at once; ``None`` when there were none."""
        with self._lock:
            times, self._times = self._times, []
            urgent, self._urgent = self._urgent, False
        if not times:
            return None
        return round(statistics.median(times) * 1e6), len(times), urgent


def _changed(recent: float, before: float, factor: float) -> bool:
    """Whether a pace moved by ``factor`` or more, either way."""
    return recent >= factor * before or before >= factor * recent
