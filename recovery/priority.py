"""A process's CPU priority, lowered while it pays a start-up cost nobody waits for yet.

A warm spare's warm-up competes for the cores with the training it stands by for. Its
threads run at a lower priority meanwhile, but only where the process may go back to its
priority afterwards (root, or an ``RLIMIT_NICE`` that allows it): a process left at a
lower priority would lag behind its peers under load for the rest of the job.

Where the kernel shares the CPU between sessions first (autogroups), a thread's niceness
weighs only within its session, and the spare leads one of its own. Lowering the
session's niceness too (by 10, or to 19 with ``SCHED_IDLE``) was measured and not kept:
the steps trained during the warm-up were no faster, and the spare was warm seconds later,
so that a fault early in the job found it cold.
"""

from __future__ import annotations

import os
import resource

__all__ = ["START_UP_NICENESS", "lower_priority", "restore_priority"]

START_UP_NICENESS = 10
"""How much the niceness rises while the start-up cost is paid."""


def lower_priority(by: int = START_UP_NICENESS) -> int | None:
    """Raise this thread's niceness by ``by`` (threads it starts later inherit it), if it
    may be lowered back; the niceness to go back to, or None when it was left alone."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    # The kernel lets a process lower its niceness to n only if 20 - n <= RLIMIT_NICE.
    if os.geteuid() != 0 and soft != resource.RLIM_INFINITY and 20 - current > soft:
        return None
    os.setpriority(os.PRIO_PROCESS, 0, min(19, current + by))
    return current


def restore_priority(niceness: int) -> None:
    """Every thread of this process back to ``niceness`` (Linux keeps it per thread)."""
    for task in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(task), niceness)
        except (ProcessLookupError, PermissionError):
            pass
