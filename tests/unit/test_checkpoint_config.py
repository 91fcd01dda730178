"""CheckpointConfig: bad input is a clear error at config time, not at the first save."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from recovery.ckpt.checkpoint import CheckpointConfig
from recovery.position import TrainPosition


def test_append_info_takes_epoch_num_step_num_and_user_values() -> None:
    lr = torch.tensor([0.5])
    config = CheckpointConfig(
        append_info=["epoch_num", "step_num", {"lr": 0.01, "tag": "a", "warm": True, "n": 3, "t": lr}])
    values = config.append_values(TrainPosition(epoch=2, step_in_epoch=5, global_step=105))
    assert values["epoch_num"] == 2
    assert values["step_num"] == 105
    assert values["lr"] == 0.01 and values["tag"] == "a" and values["warm"] is True and values["n"] == 3
    assert values["t"] is lr


@pytest.mark.parametrize(
    ("append_info", "error", "message"),
    [
        (["epoch_num", {"lr": [0.1]}], TypeError, "value of 'lr' has type list"),
        ([{"opt": object()}], TypeError, "value of 'opt' has type object"),
        ([{1: 0.1}], TypeError, "key 1 has type int"),
        (["epoch"], ValueError, "'epoch' is unknown"),
        ([3], TypeError, "entry 3 has type int"),
        ([{"a": 1}, {"b": 2}], ValueError, "at most one dict"),
        ([{"step_num": 1}], ValueError, "'step_num' is reserved"),
        ({"lr": 0.1}, TypeError, "must be a list"),
        ("epoch_num", TypeError, "must be a list"),
    ],
)
def test_bad_append_info_is_refused_with_a_clear_message(append_info: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        CheckpointConfig(append_info=append_info)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"save_checkpoint_steps": 0, "save_checkpoint_epochs": 0}, "cannot both be 0"),
        ({"save_checkpoint_steps": -1}, "save_checkpoint_steps must be an int >= 0"),
        ({"keep_checkpoint_max": 0}, "keep_checkpoint_max must be >= 1"),
        ({"save_checkpoint_epochs": 1.5}, "save_checkpoint_epochs must be an int"),
    ],
)
def test_bad_intervals_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CheckpointConfig(**kwargs)
