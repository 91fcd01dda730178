"""The on-disk names of checkpoints: parsing, MindSpore's `_n` prefix rule, TTP paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recovery.ckpt import layout
from recovery.position import TrainPosition

positions = st.builds(TrainPosition, st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**9))


def test_name_round_trips_with_dashes_and_underscores_in_the_prefix() -> None:
    name = layout.checkpoint_name("my-net_v2", TrainPosition(3, 1875, 5625))
    assert name == "my-net_v2-3_1875.ckpt"
    assert layout.parse_checkpoint_name(name) == layout.CheckpointName("my-net_v2", 3, 1875)


@given(position=positions, prefix=st.sampled_from(["net", "my-net_v2", "lenet_3", "a-1_2"]))
def test_a_position_round_trips_through_its_name(position: TrainPosition, prefix: str) -> None:
    parsed = layout.parse_checkpoint_name(layout.checkpoint_name(prefix, position))
    assert parsed == layout.CheckpointName(prefix, position.epoch, position.step_in_epoch)


@given(positions, positions)
def test_positions_order_as_their_epoch_step_global_step(a: TrainPosition, b: TrainPosition) -> None:
    assert (a < b) == (tuple(a) < tuple(b)) and (a <= b) == (tuple(a) <= tuple(b))
    assert (a > b) == (tuple(a) > tuple(b)) and (a >= b) == (tuple(a) >= tuple(b))
    assert sorted([a, b]) == sorted([b, a])


def test_a_position_unpacks_and_records_as_epoch_step_in_epoch_global_step() -> None:
    position = TrainPosition(2, 7, 57)
    assert tuple(position) == (2, 7, 57)
    assert TrainPosition.from_dict(position.as_dict()) == position
    assert position.as_dict() == {"epoch": 2, "step_in_epoch": 7, "global_step": 57}
    assert TrainPosition() == TrainPosition(1, 0, 0)


def test_negative_positions_have_no_name() -> None:
    with pytest.raises(ValueError, match="epoch and step"):
        layout.checkpoint_name("net", TrainPosition(1, -1, 0))


@pytest.mark.parametrize(
    "name", ["manifest.json", "net-1_2.ckpt.gz", "net-1.ckpt", "-1_2.ckpt", "net-a_2.ckpt", ".net-1_2.ckpt.123.tmp"]
)
def test_other_names_are_not_checkpoints(name: str) -> None:
    assert layout.parse_checkpoint_name(name) is None


@pytest.mark.parametrize("prefix", ["", "a/b", ".hidden"])
def test_bad_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        layout.checkpoint_name(prefix, TrainPosition(1, 1, 1))


@pytest.mark.parametrize(
    ("existing", "expected"),
    [
        ([], "lenet"),
        (["lenet-2_1875.ckpt", "manifest.json"], "lenet_1"),
        (["lenet-2_1875.ckpt", "lenet_1-7_1875.ckpt", "lenet_3-1_5.ckpt"], "lenet_4"),
        # Other prefixes that merely start the same way do not count.
        (["lenetx-1_1.ckpt", "lenet_x-1_1.ckpt", "lenet.txt"], "lenet"),
    ],
)
def test_a_later_run_never_reuses_a_prefix(existing: list[str], expected: str) -> None:
    assert layout.run_prefix("lenet", existing) == expected


def test_temp_names_carry_the_writer_pid_and_never_look_like_checkpoints(tmp_path: Path) -> None:
    temp = layout.temp_path(tmp_path / "net-1_2.ckpt")
    assert temp.parent == tmp_path
    assert layout.temp_owner_pid(temp.name) == os.getpid()
    assert layout.parse_checkpoint_name(temp.name) is None
    assert layout.temp_owner_pid("net-1_2.ckpt") is None


def test_rank_dirs_and_ttp_paths(tmp_path: Path) -> None:
    assert layout.rank_dir(tmp_path, 3) == tmp_path / "checkpoints" / "rank_3"
    assert layout.rank_of_dir(tmp_path / "checkpoints" / "rank_3") == 3
    assert layout.rank_of_dir(tmp_path / "checkpoints") is None
    assert layout.ttp_checkpoint_path(tmp_path, 1, TrainPosition(2, 115, 1990)) == (
        tmp_path / "ttp_checkpoints" / "tft_saved_checkpoints-step_1990" / "rank_1" / "ttp_rank_1-2_115.ckpt"
    )
