"""A process's CPU priority, lowered while it pays a start-up cost nobody waits for yet.

A warm spare's warm-up (``import torch``, the first optimizer step) competes for the cores
with the training it stands by for. It runs at a lower priority meanwhile, and goes back
to its own the moment it is handed a rank: a process left at a lower priority would lag
behind its peers under load for the rest of the job.

Linux has two priorities to lower, and both are:

* the niceness of the process's threads, which weighs them against the other threads of
  their *autogroup*;
* the niceness of the autogroup itself (``/proc/self/autogroup``). Where the kernel groups
  by session (``kernel.sched_autogroup_enabled``, on in most distributions' kernels),
  each session shares the CPU with the others as one task, whatever the niceness of its
  threads, and every child of tftrun leads a session of its own (launcher/sessions.py).
  Measured here with 4 busy sessions on 2 cores for 4 s: a session whose thread ran at
  niceness 19 still took its full share (2.1 CPU-seconds, as the others); one whose
  autogroup was at 19 took 0.26, the others 2.7 each.

The thread niceness is lowered only where it may be raised back (root, or an
``RLIMIT_NICE`` that allows it). The autogroup's needs no privilege to go back to 0 or
above (only a negative one does), so a session leader at 0 or above always lowers it; the
kernel takes at most one such change per 100 ms across the machine, and answers ``EAGAIN``
to the others, so a change is tried again for a while.
"""

from __future__ import annotations

import errno
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["START_UP_NICENESS", "Priority", "lower_priority", "restore_priority",
           "autogroup_niceness"]

START_UP_NICENESS = 10
"""How much the niceness rises while the start-up cost is paid."""
AUTOGROUP = Path("/proc/self/autogroup")
_AUTOGROUP_RETRY = 0.02
_AUTOGROUP_PATIENCE = 2.0
"""Seconds a change of the autogroup's niceness is tried again while the kernel's rate
limit refuses it."""


@dataclass(frozen=True)
class Priority:
    """What :func:`lower_priority` changed, to go back to: ``None`` where it changed nothing."""

    niceness: int | None
    autogroup: int | None


def autogroup_niceness() -> int | None:
    """This process's autogroup niceness; ``None`` when the kernel has no autogroups."""
    try:
        return int(AUTOGROUP.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def lower_priority(by: int = START_UP_NICENESS) -> Priority:
    """Raise this thread's niceness by ``by`` (threads it starts later inherit it) and, for
    a session leader, its autogroup's, where each may be lowered back."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    niceness = None
    # The kernel lets a process lower its niceness to n only if 20 - n <= RLIMIT_NICE.
    if os.geteuid() == 0 or soft == resource.RLIM_INFINITY or 20 - current <= soft:
        os.setpriority(os.PRIO_PROCESS, 0, min(19, current + by))
        niceness = current
    group = autogroup_niceness() if os.getsid(0) == os.getpid() else None
    if group is not None and (group < 0 or not _set_autogroup(min(19, group + by))):
        group = None
    return Priority(niceness, group)


def restore_priority(priority: Priority) -> None:
    """Every thread of this process, and its autogroup, back to where they were."""
    if priority.niceness is not None:
        for task in os.listdir("/proc/self/task"):
            try:
                os.setpriority(os.PRIO_PROCESS, int(task), priority.niceness)
            except (ProcessLookupError, PermissionError):
                pass
    if priority.autogroup is not None:
        _set_autogroup(priority.autogroup)


def _set_autogroup(niceness: int) -> bool:
    """Set the autogroup's niceness, waiting out the kernel's rate limit; whether it took."""
    deadline = time.monotonic() + _AUTOGROUP_PATIENCE
    while True:
        try:
            AUTOGROUP.write_text(str(niceness))
            return True
        except OSError as err:
            if err.errno != errno.EAGAIN or time.monotonic() > deadline:
                return False
        time.sleep(_AUTOGROUP_RETRY)
