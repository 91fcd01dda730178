"""Hang verdicts judge only the hung rank (issue 13).

The main job under tftrun with both the heartbeat and the progress timeout at 5 s; one
rank is SIGSTOPped. The scheduler must declare that rank dead and tftrun replace it, and
nothing else: the survivors waited for the relaunch in the step's collective, so their
last new step is older than the progress timeout when the relaunched rank starts
reporting, and the relaunched rank has no step at all for a while. Neither makes a
healthy rank hung: progress is compared within the generation, from when it formed.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from recovery import env as names
from support import TFT_OFF, events, log_has, spawn, spawned_pids, terminate, wait_for
from support.mnist import START, WORKERS, assert_recovered, mnist_job, wait_job

pytestmark = pytest.mark.timeout(300)

STOPPED = WORKERS - 1
"""The rank that is SIGSTOPped: the last one, as rank 3 of 4 was in the issue."""

MODES = {
    "lose-nothing": {k: v for k, v in os.environ.items() if k != names.MS_ENABLE_TFT},
    "rollback": TFT_OFF,
}


@pytest.mark.parametrize("modes", MODES.keys())
def test_only_the_stopped_rank_is_replaced_with_both_timeouts_at_5s(
        tmp_path: Path, free_port: int, mnist_reference: dict[int, str], modes: str) -> None:
    log_dir = tmp_path / "hang"
    proc = spawn(mnist_job(tmp_path, "hang", free_port, "--heartbeat_timeout=5",
                           "--progress_timeout=5"), env=MODES[modes])
    try:
        wait_for(lambda: log_has(log_dir, STOPPED, "step=30 "), START,
                 f"rank {STOPPED} past step 30")
        first = spawned_pids(log_dir)
        os.kill(first[STOPPED], signal.SIGSTOP)
        output = wait_job(proc)
    finally:
        terminate(proc)
    assert proc.returncode == 0, output
    verdicts = [(v["rank"], v["pid"], v["verdict"], v.get("step"), v.get("others_step"))
                for v in events(log_dir, "verdict")]
    assert [v[:2] for v in verdicts] == [(STOPPED, first[STOPPED])], verdicts
    assert_recovered(log_dir, first, [STOPPED], mnist_reference)
