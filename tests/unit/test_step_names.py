"""``step`` is the global step wherever it stands alone (events, the wire, the scheduler's
state); the step within an epoch is ``step_in_epoch``, in code and in checkpoint files and
manifests, whose older ``step`` (an earlier tftrun's) is read as such for one release.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from recovery.ckpt.manifest import CheckpointEntry, CheckpointKind, Manifest
from recovery.control.claims import LastWords
from recovery.control.members import Member, MemberState
from recovery.position import TrainPosition

counts = st.integers(min_value=0, max_value=10**9)


@given(counts, counts, counts)
def test_a_checkpoints_position_is_recorded_under_epoch_step_in_epoch_global_step(
        epoch: int, step_in_epoch: int, global_step: int) -> None:
    position = TrainPosition(epoch, step_in_epoch, global_step)
    recorded = position.as_dict()
    assert recorded == {"epoch": epoch, "step_in_epoch": step_in_epoch, "global_step": global_step}
    assert TrainPosition.from_dict(recorded) == position
    older = {"epoch": epoch, "step": step_in_epoch, "global_step": global_step}
    assert TrainPosition.from_dict(older) == position


def test_a_manifest_records_step_in_epoch_and_reads_the_manifests_already_written(
        tmp_path: Path) -> None:
    older = {"name": "net-2_7.ckpt", "epoch": 2, "step": 7, "global_step": 57, "rank": 0,
             "world_size": 2, "size": 10, "sha256": None, "time": 1.0, "seq": 3,
             "lineage": "cafe", "kind": "periodic", "xxh3_128": "0" * 32}
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 1, "entries": [older]}))
    manifest = Manifest(tmp_path)
    entry = manifest.entries()["net-2_7.ckpt"]
    assert (entry.epoch, entry.step_in_epoch, entry.global_step) == (2, 7, 57)
    assert entry.kind is CheckpointKind.PERIODIC and entry.seq == 3

    manifest.add(CheckpointEntry("net-2_8.ckpt", 2, 8, 58, 0, 2, 10, "1" * 32, 2.0))
    written = json.loads((tmp_path / "manifest.json").read_text())["entries"]
    assert [(e["name"], e["step_in_epoch"]) for e in written] == [("net-2_7.ckpt", 7), ("net-2_8.ckpt", 8)]
    renamed = {("step_in_epoch" if key == "step" else key): value for key, value in older.items()}
    assert written[0] == {key: value for key, value in renamed.items() if key != "sha256"}
    assert all("step" not in e for e in written)


def test_the_schedulers_state_records_a_members_and_a_grants_step() -> None:
    member = Member("1", 1, 100, 0, "h", MemberState.ALIVE, global_step=42)
    recorded = json.loads(json.dumps(member.to_json()))
    assert recorded["step"] == 42 and "global_step" not in recorded
    assert Member.from_json(recorded).global_step == 42

    claims = LastWords()
    assert claims.claim(generation=3, rank=1, global_step=42, consistent=True)
    recorded_grants = json.loads(json.dumps(claims.to_json()))
    assert recorded_grants == {"3": {"rank": 1, "step": 42}}
    assert LastWords.parse(recorded_grants)[3].global_step == 42
