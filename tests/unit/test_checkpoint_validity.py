"""A torn, truncated, bit-flipped, unlisted or unsafe file is never loaded, and is reported."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from recovery.ckpt import layout
from recovery.ckpt.checkpoint import CheckpointSaver
from recovery.ckpt.durable import file_digest, write_atomic
from recovery.ckpt.manifest import CheckpointEntry, InvalidCheckpointError, Manifest, newest_valid, verify_dir
from recovery.ckpt.restore import load_checkpoint, resume
from recovery.position import TrainPosition


@pytest.fixture
def three(tmp_path: Path) -> list[Path]:
    """Checkpoints at global steps 10, 20, 30 in ``tmp_path``, oldest first."""
    saver = CheckpointSaver(torch.nn.Linear(4, 2), directory=tmp_path, prefix="net")
    return [saver.save(TrainPosition(1, g, g)) for g in (10, 20, 30)]


def skipped(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def chosen(directory: Path) -> Path:
    found = newest_valid(directory)
    assert found is not None
    return found[0].path


def flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_newest_is_the_highest_step_not_the_newest_file(three: list[Path]) -> None:
    for age, path in enumerate(three):
        os.utime(path, (1_000_000 - age, 1_000_000 - age))  # the oldest step gets the newest mtime
    assert chosen(three[0].parent) == three[2]


def test_truncated_and_bit_flipped_files_are_skipped_with_one_warning_each(
    three: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    with open(three[2], "r+b") as file:
        file.truncate(three[2].stat().st_size // 2)
    flip_a_bit(three[1])
    with caplog.at_level(logging.WARNING):
        assert chosen(three[0].parent) == three[0]
    warnings = skipped(caplog)
    assert len(warnings) == 2
    assert str(three[2]) in warnings[0] and "truncated" in warnings[0]
    assert str(three[1]) in warnings[1] and "xxh3_128 differs" in warnings[1]
    assert all("\n" not in w for w in warnings)


def test_a_file_missing_from_the_manifest_is_never_loaded(three: list[Path], caplog: pytest.LogCaptureFixture) -> None:
    unlisted = three[0].with_name("net-1_99.ckpt")
    shutil.copy(three[2], unlisted)  # complete and loadable, but never recorded
    with caplog.at_level(logging.WARNING):
        assert chosen(three[0].parent) == three[2]
    assert len(skipped(caplog)) == 1
    assert str(unlisted) in skipped(caplog)[0] and "not in the manifest" in skipped(caplog)[0]
    with pytest.raises(InvalidCheckpointError, match="not in the manifest"):
        load_checkpoint(unlisted)


def test_a_listed_file_that_is_gone_is_reported_missing(three: list[Path], caplog: pytest.LogCaptureFixture) -> None:
    three[2].unlink()
    with caplog.at_level(logging.WARNING):
        assert chosen(three[0].parent) == three[1]
    assert "missing" in skipped(caplog)[0]


def test_a_file_that_needs_arbitrary_unpickling_is_refused_even_if_listed(
    three: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    directory = three[0].parent
    unsafe = directory / "net-1_40.ckpt"
    digest = write_atomic(unsafe, lambda f: torch.save({"model": {}, "hook": shutil.copy}, f))
    Manifest(directory).add(CheckpointEntry(unsafe.name, 1, 40, 40, 0, 1, digest.size, digest.checksum,
                                            0.0))
    with caplog.at_level(logging.WARNING):
        assert chosen(directory) == three[2]
    assert "arbitrary unpickling" in skipped(caplog)[0]
    model = torch.nn.Linear(4, 2)
    assert resume(directory, model).path == three[2]


def test_verify_dir_names_every_bad_file(three: list[Path]) -> None:
    flip_a_bit(three[0])
    results = {c.path.name: reason for c, reason in verify_dir(three[0].parent)}
    assert results == {"net-1_30.ckpt": None, "net-1_20.ckpt": None,
                       "net-1_10.ckpt": "corrupt: xxh3_128 differs from the manifest"}


def test_an_entry_with_only_an_older_tftruns_sha256_is_listed_but_never_loaded(
        three: list[Path], caplog: pytest.LogCaptureFixture) -> None:
    manifest = layout.manifest_path(three[0].parent)
    content = json.loads(manifest.read_text())
    newest = content["entries"][2]
    newest["sha256"] = hashlib.sha256(three[2].read_bytes()).hexdigest()
    del newest["xxh3_128"]
    manifest.write_text(json.dumps(content))
    with caplog.at_level(logging.WARNING):
        assert chosen(three[0].parent) == three[1]
    assert str(three[2]) in skipped(caplog)[0] and "unverifiable" in skipped(caplog)[0]
    with pytest.raises(InvalidCheckpointError, match="no xxh3_128"):
        load_checkpoint(three[2])
    results = {c.path.name: reason for c, reason in verify_dir(three[0].parent)}
    assert results == {"net-1_30.ckpt": "unverifiable: the manifest gives no xxh3_128 (an older tftrun's entry)",
                       "net-1_20.ckpt": None, "net-1_10.ckpt": None}


def test_a_damaged_manifest_trusts_no_file(three: list[Path], caplog: pytest.LogCaptureFixture) -> None:
    layout.manifest_path(three[0].parent).write_text("{ not json")
    with caplog.at_level(logging.WARNING):
        assert newest_valid(three[0].parent) is None
    assert any("unreadable checkpoint manifest" in w for w in skipped(caplog))


def test_write_atomic_leaves_nothing_when_the_writer_fails(tmp_path: Path) -> None:
    def fail(file: object) -> None:
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_atomic(tmp_path / "x.ckpt", fail)
    assert os.listdir(tmp_path) == []
    digest = write_atomic(tmp_path / "y.bin", lambda f: f.write(b"abc"))
    assert digest == file_digest(tmp_path / "y.bin") and digest.size == 3
    spare = tmp_path / ".spare.tmp"
    spare.write_bytes(b"x" * 100_000)  # a larger file, written over: cut to what was written
    digest = write_atomic(tmp_path / "z.bin", lambda f: f.write(b"abcd"), reuse=spare)
    assert (tmp_path / "z.bin").read_bytes() == b"abcd" and not spare.exists()
    assert digest == file_digest(tmp_path / "z.bin")
