"""recovery/train/replay.py: reading a run's membership changes, and what each rank does to
make them again at the same steps (the real replay: tests/integration/test_degraded.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recovery.train.replay import BeforeStep, MembershipChange, MembershipReplay, ReplayError, recorded_changes


def membership(generation: int, active: list[int], why: str, lost: tuple[int, ...] = (),
               joined: tuple[int, ...] = (), **extra: Any) -> dict[str, Any]:
    """A ``membership`` event as the scheduler writes it (docs/events.md)."""
    return {"event": "membership", "generation": generation, "active": active,
            "world": len(active), "why": why, "lost": list(lost), "joined": list(joined), **extra}


def rollback(generation: int, step: int) -> dict[str, Any]:
    return {"event": "rollback", "generation": generation, "step": step, "source": "replica"}


KILL_AND_HEAL = [
    membership(0, [0, 1, 2], "start"),
    {"event": "step", "rank": 0, "step": 10, "generation": 0},
    membership(1, [0, 2], "shrink", lost=(1,)),
    rollback(1, 39),
    membership(2, [0, 1, 2], "grow", joined=(1,)),
    rollback(2, 414),
    rollback(2, 500),  # a later repair in place, in the same generation
]


def test_each_generation_takes_the_step_of_its_first_rollback() -> None:
    assert recorded_changes(KILL_AND_HEAL) == [
        MembershipChange(0, (0, 1, 2), 3, "start", (), (), 0),
        MembershipChange(1, (0, 2), 2, "shrink", (1,), (), 39),
        MembershipChange(2, (0, 1, 2), 3, "grow", (), (1,), 414),
    ]


def test_a_lost_rank_dies_before_the_step_after_the_recorded_one() -> None:
    replay = MembershipReplay(recorded_changes(KILL_AND_HEAL))
    assert replay.before_step(1, 0, 38, newer=False) is BeforeStep.GO
    assert replay.before_step(1, 0, 39, newer=False) is BeforeStep.KILL
    # Its peers run the step; its death voids it, and they train on from step 39.
    assert replay.before_step(0, 0, 39, newer=False) is BeforeStep.GO
    assert replay.before_step(0, 0, 39, newer=True) is BeforeStep.LEAVE


def test_a_grow_waits_for_the_recorded_step_and_no_later() -> None:
    replay = MembershipReplay(recorded_changes(KILL_AND_HEAL))
    # Formed early (the returning rank was ready sooner): the survivors train on alone.
    assert replay.holds(1, 413)
    assert replay.before_step(0, 1, 413, newer=True) is BeforeStep.GO
    # At the recorded step they leave, formed or not (then they wait for it).
    assert not replay.holds(1, 414)
    assert replay.before_step(0, 1, 414, newer=False) is BeforeStep.LEAVE
    assert replay.before_step(2, 1, 414, newer=True) is BeforeStep.LEAVE
    # After the last recorded change: as any run.
    assert replay.before_step(1, 2, 414, newer=False) is BeforeStep.GO
    assert replay.before_step(1, 2, 600, newer=True) is BeforeStep.LEAVE
    assert not replay.holds(2, 600)


def test_a_shrink_is_never_held() -> None:
    replay = MembershipReplay(recorded_changes(KILL_AND_HEAL))
    assert not replay.holds(0, 10)
    assert replay.before_step(0, 0, 10, newer=True) is BeforeStep.LEAVE


def test_a_generation_unlike_the_record_is_told() -> None:
    replay = MembershipReplay(recorded_changes(KILL_AND_HEAL))
    assert replay.diverged(2, (0, 1, 2), 414) is None
    assert replay.diverged(2, (0, 1, 2), 237) == (
        "generation 2 has ranks [0, 1, 2] from step 237; the record has [0, 1, 2] from step 414")
    assert replay.diverged(3, (0, 2), 500) == "generation 3 is not in the record"


@pytest.mark.parametrize(("events", "says"), [
    ([], "no membership event"),
    ([membership(0, [0, 1], "start"), membership(1, [0, 1], "replace"), rollback(1, 5)],
     "only changes that lose ranks or that take ranks in"),
    ([membership(0, [0, 1, 2], "start"), membership(1, [0, 2], "shrink", lost=(1,))],
     "generation 1 never trained"),
    ([membership(0, [0, 1, 2], "start"), membership(1, [0, 2], "shrink", lost=(1,)),
      rollback(1, 5), membership(1, [0, 2], "shrink", retired=[1], reason="not back")],
     "retirements are not replayed"),
])
def test_a_record_the_replay_cannot_make_is_refused(tmp_path: Path, events: list[dict[str, Any]],
                                                   says: str) -> None:
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    with pytest.raises(ReplayError, match=says):
        MembershipReplay.load(tmp_path)


def test_a_record_is_read_from_its_log_dir_or_its_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in KILL_AND_HEAL))
    assert MembershipReplay.load(tmp_path).changes == MembershipReplay.load(path).changes
