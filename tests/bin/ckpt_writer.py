"""Test helper: save a small checkpoint, then a big one, then exit without waiting.

    python ckpt_writer.py DIR sync|async MEGABYTES

The big checkpoint takes long enough to write that a test can catch the process in the
middle of it (its temporary file exists) and kill it; in ``async`` mode the process exits
right after asking for the save, so the test sees whether exit waits for the writer.
"""

from __future__ import annotations

import sys

import torch

from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver
from recovery.position import TrainPosition


def main(directory: str, mode: str, megabytes: int) -> None:
    model = torch.nn.Linear(4, 2)
    saver = CheckpointSaver(model, directory=directory, prefix="net",
                            config=CheckpointConfig(async_save=mode == "async"))
    saver.save(TrainPosition(1, 1, 1))
    saver.wait()
    model.register_buffer("big", torch.ones(megabytes * 2**20 // 4))
    saver.save(TrainPosition(1, 2, 2))
    print("save requested", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
