"""The on-disk names of checkpoints: parsing, MindSpore's `_n` prefix rule, TTP paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recovery import layout


def test_name_round_trips_with_dashes_and_underscores_in_the_prefix() -> None:
    name = layout.checkpoint_name("my-net_v2", 3, 1875)
    assert name == "my-net_v2-3_1875.ckpt"
    assert layout.parse_checkpoint_name(name) == layout.CheckpointName("my-net_v2", 3, 1875)


@pytest.mark.parametrize(
    "name", ["manifest.json", "net-1_2.ckpt.gz", "net-1.ckpt", "-1_2.ckpt", "net-a_2.ckpt", ".net-1_2.ckpt.123.tmp"]
)
def test_other_names_are_not_checkpoints(name: str) -> None:
    assert layout.parse_checkpoint_name(name) is None


@pytest.mark.parametrize("prefix", ["", "a/b", ".hidden"])
def test_bad_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        layout.checkpoint_name(prefix, 1, 1)


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
    assert layout.ttp_checkpoint_path(tmp_path, 1990, 1, 2, 115) == (
        tmp_path / "ttp_checkpoints" / "tft_saved_checkpoints-step_1990" / "rank_1" / "ttp_rank_1-2_115.ckpt"
    )
