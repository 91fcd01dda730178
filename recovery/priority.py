"""A process's CPU priority, lowered while it pays a start-up cost nobody waits for yet.

The scheduler's ``import torch`` at a job's launch, and a warm spare's warm-up, compete
for the cores with the workers' own start-up, which is what the job waits for. They run
at a lower priority meanwhile, but only where the process may go back to its priority
afterwards: a process left at a lower priority would lag behind its peers under load for
the rest of the job.

Two knobs, because a thread's niceness alone does nothing here. tftrun starts every child
in a session of its own, and where the kernel groups tasks by session (autogroup:
``/proc/sys/kernel/sched_autogroup_enabled`` = 1, the default of many distributions, in
the root CPU cgroup) the cores are shared between sessions first, and niceness only
weighs threads within one session: a niced scheduler still took a full share of the cores
beside four workers (measured: 1.29 CPU-seconds of a 4.2 s launch). So a process that
leads its own session also lowers its session's autogroup (``/proc/self/autogroup``), which
any user may raise and lower between 0 and 19. The thread niceness is lowered only where
it may be raised back (root, or an ``RLIMIT_NICE`` that allows it).
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["START_UP_NICENESS", "Lowered", "lower_priority", "restore_priority", "autogroup_nice"]

logger = logging.getLogger(__name__)

START_UP_NICENESS = 10
"""How much the niceness rises while the start-up cost is paid."""
AUTOGROUP = Path("/proc/self/autogroup")
_MAX_NICE = 19
_AUTOGROUP_RETRIES = 200
_AUTOGROUP_RETRY_PAUSE = 0.01
"""The kernel lets an unprivileged process change an autogroup's nice once per 0.1 s, for
the whole machine (EAGAIN meanwhile); going back is retried for up to about 2 s."""
_RESTORING = threading.Lock()


@dataclass(frozen=True)
class Lowered:
    """What :func:`lower_priority` changed: the values to go back to (None: left alone)."""

    niceness: int | None
    autogroup_nice: int | None
    restored: threading.Event = field(default_factory=threading.Event, compare=False)


def lower_priority(by: int = START_UP_NICENESS, at_most: float | None = None) -> Lowered | None:
    """Raise this thread's niceness by ``by`` (threads it starts later inherit it), if it
    may be lowered back, and, in a process that leads its own session, its autogroup's
    nice; what to go back to, or None when nothing was changed.

    Args:
        at_most: go back by itself after this many seconds (a daemon timer), whether or
            not :func:`restore_priority` was called: a start-up that others will need
            must not starve for as long as busy peers keep the cores.
    """
    lowered = Lowered(_lower_niceness(by), _lower_autogroup(by))
    if lowered == Lowered(None, None):
        return None
    if at_most is not None:
        timer = threading.Timer(at_most, restore_priority, args=(lowered,))
        timer.daemon = True
        timer.name = "tft-priority-restore"
        timer.start()
    return lowered


def restore_priority(lowered: Lowered) -> None:
    """This process back to where :func:`lower_priority` found it: its autogroup, and every
    thread's niceness (Linux keeps it per thread). Once (``restored`` is set when done);
    later calls do nothing."""
    with _RESTORING:
        if not lowered.restored.is_set():
            _restore(lowered)
            lowered.restored.set()


def _restore(lowered: Lowered) -> None:
    if lowered.autogroup_nice is not None and not _set_autogroup_nice(lowered.autogroup_nice):
        logger.warning("could not put this session's autogroup back to nice %d",
                       lowered.autogroup_nice)
    if lowered.niceness is None:
        return
    for task in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(task), lowered.niceness)
        except (ProcessLookupError, PermissionError):
            pass


def _lower_niceness(by: int) -> int | None:
    current = os.getpriority(os.PRIO_PROCESS, 0)
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    # The kernel lets a process lower its niceness to n only if 20 - n <= RLIMIT_NICE.
    if os.geteuid() != 0 and soft != resource.RLIM_INFINITY and 20 - current > soft:
        return None
    os.setpriority(os.PRIO_PROCESS, 0, min(_MAX_NICE, current + by))
    return current


def _lower_autogroup(by: int) -> int | None:
    """Lower the autogroup of this process's session if it leads that session alone (a
    process started from a shell shares the shell's: lowering it would slow the user's
    other programs); the nice to go back to, or None."""
    if os.getsid(0) != os.getpid():
        return None
    current = autogroup_nice()
    if current is None or current < 0 or not _set_autogroup_nice(min(_MAX_NICE, current + by)):
        return None
    return current


def autogroup_nice() -> int | None:
    """The nice of this process's autogroup; None where the kernel has none."""
    try:
        # e.g. "/autogroup-5904 nice 10"
        return int(AUTOGROUP.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _set_autogroup_nice(nice: int) -> bool:
    for _ in range(_AUTOGROUP_RETRIES):
        try:
            AUTOGROUP.write_text(str(nice))
            return True
        except OSError as err:
            if err.errno != errno.EAGAIN:
                return False
        time.sleep(_AUTOGROUP_RETRY_PAUSE)
    return False
