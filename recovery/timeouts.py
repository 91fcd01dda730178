"""The cluster's timeouts, their defaults and why, read from the env contract.

Scheduler and workers read the same variables (tftrun sets them from its options; a
launch script by hand may leave them unset and get the defaults):

* ``rejoin_cooldown`` (30 s): msrun's value. A node id whose process died abnormally may
  not register again before it has passed, so that a flapping process or a network
  blip does not churn the whole cluster (and, in msrun's words, against "malicious
  registration"). ``0`` turns it off.
* ``cluster_time_out`` (600 s): msrun's ``--cluster_time_out`` default. How long workers
  wait for all ``worker_num`` to join before giving up with an error.
* ``heartbeat_timeout`` (30 s): a process that dies is seen by its supervisor at once
  (``waitpid``); heartbeats only matter for a process that is alive but frozen
  (SIGSTOP, a GIL held in a deadlock, a stuck disk) or on another host. The heartbeat
  thread needs the GIL, which a long pickling, a full garbage collection or an
  overloaded host can withhold for seconds; a false "dead" costs a kill, a cooldown
  and a restart, so the timeout sits well above such pauses.
* ``progress_timeout`` (300 s): a worker that heartbeats but stays behind another
  worker's step of its generation this long is hung (recovery/control/membership.py).
  It must exceed the longest legitimate pause of one rank while the others wait at the
  next collective (a rank-0-only checkpoint save, an evaluation pass), and stay under
  torch's NCCL collective timeout (10 min), so that the verdict comes before the waiting
  ranks' collectives fail.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from recovery import env as names

__all__ = [
    "Timeouts",
    "DEFAULT_REJOIN_COOLDOWN",
    "DEFAULT_CLUSTER_TIME_OUT",
    "DEFAULT_HEARTBEAT_TIMEOUT",
    "DEFAULT_PROGRESS_TIMEOUT",
]

DEFAULT_REJOIN_COOLDOWN = 30.0
DEFAULT_CLUSTER_TIME_OUT = 600.0
DEFAULT_HEARTBEAT_TIMEOUT = 30.0
DEFAULT_PROGRESS_TIMEOUT = 300.0

# At least 5 beats per timeout: one lost or late beat must never be enough to declare a
# worker dead (nor to leave its progress unheard). A worker looks for news (a new
# generation, a fault injection) at least once a second, and is told to retry that soon.
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
    """The cluster's timeouts, in seconds (see the module docstring for the defaults)."""

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
        """How often a worker looks for news from the scheduler (at most a second), and
        how soon a refused registration is to ask again."""
        return min(_MAX_HEARTBEAT_INTERVAL, self.beat_interval)

    @property
    def beat_interval(self) -> float:
        """How often a worker heartbeats when there is no news: what the heartbeat and
        progress timeouts need (5 beats each), and no more often (docs/scale.md)."""
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
