"""recovery/priority.py: a start-up paid at a lower priority yields the cores to the
processes of other sessions too (tftrun starts every child in a session of its own)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from recovery.priority import autogroup_nice

SPIN_SECONDS = 1.0
_SPINNER = """
import os, sys, time
from recovery.priority import lower_priority, restore_priority
os.sched_setaffinity(0, {{{cpu}}})
lowered = lower_priority() if sys.argv[1] == "low" else None
if sys.argv[1] == "low" and lowered is None:
    print("unchanged")
    sys.exit()
start, cpu = time.monotonic(), time.process_time()
while time.monotonic() - start < {seconds}:
    pass
print(time.process_time() - cpu)
"""


def _spin_side_by_side() -> tuple[str, str]:
    """Two busy processes on one core, each leading its own session as tftrun's children
    do, the first at a lowered priority: the CPU seconds each got."""
    code = _SPINNER.format(cpu=min(os.sched_getaffinity(0)), seconds=SPIN_SECONDS)
    children = [subprocess.Popen([sys.executable, "-c", code, which], stdout=subprocess.PIPE,
                                 text=True, start_new_session=True)
                for which in ("low", "normal")]
    low, normal = (child.communicate(timeout=60)[0].strip() for child in children)
    return low, normal


def test_a_lowered_start_up_yields_the_core_to_a_process_of_another_session() -> None:
    low, normal = _spin_side_by_side()
    if low == "unchanged":
        pytest.skip("this process may neither lower and restore its niceness nor its autogroup")
    # Nice 10 against 0 weighs about 1:9; at an equal share (the niceness of a thread
    # alone, across sessions grouped by the kernel) both would get about the same.
    assert float(low) < 0.5 * float(normal), (low, normal)


def test_a_session_leader_gets_its_autogroup_back() -> None:
    code = ("import os; from recovery.priority import lower_priority, restore_priority, "
            "autogroup_nice; before = autogroup_nice(); lowered = lower_priority(); "
            "low = autogroup_nice(); lowered is None or restore_priority(lowered); "
            "print(before, low, autogroup_nice())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True, start_new_session=True)
    before, low, after = done.stdout.split()
    if before == "None":
        pytest.skip("this kernel has no autogroups")
    assert int(low) > int(before) and after == before


def test_a_process_sharing_its_session_leaves_the_sessions_autogroup_alone() -> None:
    """A scheduler started by hand from a shell must not slow the shell's other programs."""
    code = ("from recovery.priority import lower_priority, autogroup_nice; "
            "lowered = lower_priority(); print(autogroup_nice()); "
            "lowered is None or print(lowered.autogroup_nice)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() in ([str(autogroup_nice())], [str(autogroup_nice()), "None"])


def test_a_bounded_start_up_goes_back_by_itself() -> None:
    """The scheduler's import at launch yields for at most a few seconds: it must not
    starve while a plain script's workers train at full speed."""
    code = ("import os, time; from recovery.priority import lower_priority; "
            "before = os.getpriority(os.PRIO_PROCESS, 0); "
            "lowered = lower_priority(at_most=0.2); "
            "low = os.getpriority(os.PRIO_PROCESS, 0); "
            "lowered is None or lowered.restored.wait(10); "
            "print(lowered is None, before, low, os.getpriority(os.PRIO_PROCESS, 0))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True, start_new_session=True)
    unchanged, before, low, after = done.stdout.split()
    if unchanged == "True":
        pytest.skip("this process may neither lower and restore its niceness nor its autogroup")
    assert after == before and (int(low) > int(before) or autogroup_nice() is not None)
