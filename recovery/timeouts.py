"""The cluster's timeouts and their defaults, read alike by scheduler and workers from the env.

``rejoin_cooldown`` and ``cluster_time_out`` default to msrun's values. The heartbeat timeout
sits well above the seconds a busy GIL can withhold a beat: a false "dead" costs a restart. The
progress timeout (a rank this long behind another's step is hung) exceeds a rank's longest
legitimate pause but stays under NCCL's collective timeout, so the verdict comes first.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from recovery import env as names

__all__ = ["Timeouts", "DEFAULT_REJOIN_COOLDOWN", "DEFAULT_CLUSTER_TIME_OUT",
           "DEFAULT_HEARTBEAT_TIMEOUT", "DEFAULT_PROGRESS_TIMEOUT"]

DEFAULT_REJOIN_COOLDOWN = 30.0
DEFAULT_CLUSTER_TIME_OUT = 600.0
DEFAULT_HEARTBEAT_TIMEOUT = 30.0
DEFAULT_PROGRESS_TIMEOUT = 300.0

# At least 5 beats per timeout: one lost or late beat must never be enough to declare a
# worker dead.
_MAX_HEARTBEAT_INTERVAL = 1.0
_BEATS_PER_TIMEOUT = 5


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise ValueError(f"environment variable {name}={raw!r} is not a finite number of seconds")
    return seconds


@dataclass(frozen=True)
class Timeouts:
    """The cluster's timeouts, in seconds. ``rejoin_cooldown``: how long a node id whose
    process died abnormally may not register again (0: off)."""

    rejoin_cooldown: float = DEFAULT_REJOIN_COOLDOWN
    cluster_time_out: float = DEFAULT_CLUSTER_TIME_OUT
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    progress_timeout: float = DEFAULT_PROGRESS_TIMEOUT

    def __post_init__(self) -> None:
        if self.rejoin_cooldown < 0:
            raise ValueError(f"rejoin_cooldown must not be negative, got {self.rejoin_cooldown}")
        for name in ("cluster_time_out", "heartbeat_timeout", "progress_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def heartbeat_interval(self) -> float:
        """How often a worker looks for news from the scheduler, and how soon a refused
        registration asks again."""
        return min(_MAX_HEARTBEAT_INTERVAL, self.beat_interval)

    @property
    def beat_interval(self) -> float:
        """How often a worker heartbeats when there is no news: what the timeouts need, and
        no more often (docs/scale.md)."""
        return min(self.heartbeat_timeout, self.progress_timeout) / _BEATS_PER_TIMEOUT

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Timeouts:
        env = os.environ if env is None else env
        return cls(
            rejoin_cooldown=_seconds(env, names.TFT_REJOIN_COOLDOWN, DEFAULT_REJOIN_COOLDOWN),
            cluster_time_out=_seconds(env, names.TFT_CLUSTER_TIME_OUT, DEFAULT_CLUSTER_TIME_OUT),
            heartbeat_timeout=_seconds(env, names.TFT_HEARTBEAT_TIMEOUT,
                                       DEFAULT_HEARTBEAT_TIMEOUT),
            progress_timeout=_seconds(env, names.TFT_PROGRESS_TIMEOUT, DEFAULT_PROGRESS_TIMEOUT),
        )
