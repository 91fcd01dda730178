"""What the scheduler writes to its state file, and when: decisions at once, heartbeats
never (docs/scheduler.md, "The scheduler's own death"; docs/scale.md)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.control.files import StateFile
from recovery.control.persistence import PERSIST_EVERY
from recovery.control.scheduler import Scheduler
from support.sched_inprocess import ask, reloaded, scheduler


def worker(rank: int) -> dict[str, Any]:
    return {"node_id": str(rank), "pid": 100 + rank, "incarnation": 0, "host": "h", "rank": None}


def formed(tmp_path: Path) -> Scheduler:
    """A scheduler of 2 workers whose generation is formed (and saved)."""
    sched = scheduler(tmp_path)
    for rank in (0, 1):
        assert ask(sched, "register", **worker(rank))["ok"]
    assert sched.membership.active_ranks() == [0, 1]
    return sched


def persisted_steps(tmp_path: Path) -> dict[str, int | None]:
    state = StateFile(tmp_path / "recovery").load()
    assert state is not None
    return {m["node_id"]: m["step"] for m in state["membership"]["members"]}


def test_heartbeats_bring_the_state_files_time_up_to_date_not_its_content(
        tmp_path: Path) -> None:
    """Their steps are not written (an encoding of every member, 40 ms at 8192); the
    file's time is, at most every PERSIST_EVERY s, since other nodes read it as the
    job's sign of life; the next decision saves the steps with it."""
    sched = formed(tmp_path)
    state = StateFile(tmp_path / "recovery")
    saved = state.path.read_bytes()
    os.utime(state.path, (0, 0))
    sched._saved_at -= PERSIST_EVERY  # the save was a second ago
    assert ask(sched, "heartbeat", **worker(0), step=7, phase="train")["ok"]
    assert state.path.read_bytes() == saved
    assert state.path.stat().st_mtime > time.time() - 60
    os.utime(state.path, (0, 0))
    assert ask(sched, "heartbeat", **worker(1), step=7, phase="train")["ok"]
    assert state.path.stat().st_mtime == 0  # not again within PERSIST_EVERY
    assert persisted_steps(tmp_path) == {"0": None, "1": None}
    left = ask(sched, "exit", node_id="1", rank=None, pid=101, incarnation=0, abnormal=True,
               reason="SIGKILL")
    assert left["ok"]
    assert persisted_steps(tmp_path) == {"0": 7, "1": 7}


_BEATS = st.lists(st.tuples(st.sampled_from([0, 1]), st.none() | st.integers(0, 4),
                            st.sampled_from([None, "train", "save"])), max_size=12)


@given(beats=_BEATS, saved_at=st.integers(0, 12))
@settings(max_examples=40, deadline=None)
def test_a_relaunched_scheduler_learns_the_steps_not_saved_from_the_next_beats(
        beats: list[tuple[int, int | None, str | None]], saved_at: int) -> None:
    """Whatever the heartbeats since the last save, a scheduler relaunched from the file
    holds, once each member beat again (a beat repeats its latest step and phase), the
    steps the progress rule compares, as the killed one held them."""
    with tempfile.TemporaryDirectory() as tmp:
        killed = formed(Path(tmp))
        for index, (rank, step, phase) in enumerate(beats):
            if index == saved_at:
                killed._save(finished=False)  # a decision's save, between two beats
            assert ask(killed, "heartbeat", **worker(rank), step=step, phase=phase)["ok"]
        relaunched = reloaded(Path(tmp))
        for rank in (0, 1):
            latest = killed.membership.members[str(rank)]
            assert ask(relaunched, "heartbeat", **worker(rank), step=latest.global_step,
                       phase=latest.phase)["ok"]
        for rank in (0, 1):
            was, now = (s.membership.members[str(rank)] for s in (killed, relaunched))
            assert (now.global_step, now.generation_step, now.phase) \
                == (was.global_step, was.generation_step, was.phase), rank
