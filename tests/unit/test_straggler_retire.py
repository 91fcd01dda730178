"""A rank evicted as a straggler twice within a window is retired, while the job keeps
``--min_worker_num`` ranks without it: the decision, and the scheduler carrying it out."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.control.eviction import retires
from recovery.control.scheduler import Scheduler
from recovery.control.stragglers import StragglerSettings
from recovery.timeouts import Timeouts
from support import events
from support.sched_inprocess import ask, scheduler

STEPS = st.integers(min_value=0, max_value=10_000)


@settings(max_examples=300, deadline=None)
@given(measured_from=st.none() | STEPS, gap=STEPS, window=st.integers(1, 500),
       ranks_left=st.integers(0, 64), min_worker_num=st.integers(1, 64))
def test_only_a_relapse_within_the_window_above_min_worker_num_is_retired(
        measured_from: int | None, gap: int, window: int, ranks_left: int,
        min_worker_num: int) -> None:
    since = (measured_from or 0) + gap
    retired = retires(measured_from, since, window, ranks_left, min_worker_num)
    if measured_from is None or ranks_left < min_worker_num:
        assert not retired  # a first eviction, or one the job could not train without
    else:
        assert retired == (gap < window)
        # slow from the replacement's first measured step: always within the window
        assert retires(measured_from, measured_from, window, ranks_left, min_worker_num)


def report(rank: int, pid: int, incarnation: int = 1) -> dict[str, Any]:
    return {"node_id": str(rank), "pid": pid, "incarnation": incarnation, "host": "h",
            "rank": rank, "op": "register", "step": None, "phase": None, "age": 0}


def evicting(tmp_path: Path, min_worker_num: int) -> Scheduler:
    """A scheduler of 3 ranks under ``evict`` with a window of 10 steps and no cooldown."""
    from torch.distributed import HashStore

    config = replace(scheduler(tmp_path).config, worker_num=3, min_worker_num=min_worker_num,
                     timeouts=Timeouts(rejoin_cooldown=0.0),
                     stragglers=StragglerSettings(window=10, policy="evict"))
    sched = Scheduler(config)
    sched._client = HashStore()
    return sched


@pytest.mark.parametrize(("min_worker_num", "healthy_beats", "retired"), [
    (2, 0, True),   # its relaunch slow from its first measured step: the host is slow
    (2, 1, False),  # its relaunch ran a whole window (10 steps) at pace first: relaunched again
    (3, 0, False),  # the job would train below --min_worker_num without it: relaunched again
])
def test_a_straggler_whose_relaunch_is_named_again_within_the_window_is_retired(
        tmp_path: Path, min_worker_num: int, healthy_beats: int, retired: bool) -> None:
    sched = evicting(tmp_path, min_worker_num)
    ranks = [report(r, 100 + r) for r in range(3)]
    ask(sched, "node_beat", node="h/0", ranks=ranks)
    step = 0

    def beat(slow: int | None) -> None:
        nonlocal step
        step += 10
        assert ask(sched, "node_beat", node="h/0", ranks=[
            {**entry, "op": "heartbeat", "step": step, "age": 0, "steps": 10,
             "step_us": 5000 if entry["rank"] == slow else 1000} for entry in ranks])["ok"]

    beat(slow=None)  # each process's first summary is its warm-up
    beat(slow=2)
    assert [e["rank"] for e in events(tmp_path / "logs", "verdict")] == [2]
    ranks[2] = report(2, 202, incarnation=2)  # its relaunch, after the (zero) cooldown
    ask(sched, "node_beat", node="h/0", ranks=[ranks[2]])
    assert ask(sched, "status")["complete"]
    beat(slow=None)  # the relaunch's warm-up
    for _ in range(healthy_beats):
        beat(slow=None)
    beat(slow=2)
    assert [e["rank"] for e in events(tmp_path / "logs", "verdict")] == [2, 2]
    retirements = [e for e in events(tmp_path / "logs", "membership") if e.get("retired")]
    status = ask(sched, "status")
    if retired:
        [retirement] = retirements
        assert (retirement["retired"], retirement["active"], retirement["world"]) == ([2], [0, 1], 2)
        assert "evicted as a straggler again 0 steps after its relaunch" in retirement["reason"]
        assert status["retired"] == [2] and status["missing"] == []
    else:
        assert retirements == [] and status["retired"] == [] and status["missing"] == [2]
