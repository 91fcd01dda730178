"""A recovery costs the same in a young job and an old one.

Each candidate is hashed at most once per rollback (later rollbacks of the same process
hash only what changed), and neither last-words directories nor the checkpoints of
earlier incarnations (per-relaunch prefixes) pile up: the keep rule prunes them.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import recovery.ckpt.manifest as manifest
from recovery.ckpt import layout
from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver
from recovery.ckpt.durable import FileDigest
from recovery.ckpt.last_words import save_last_words
from recovery.ckpt.manifest import candidates, problem
from recovery.position import TrainPosition
from recovery.train.rollback import checkpoint_dirs, choose_rollback
from support import free_tcp_port

LINEAGE = "job-a"


def _saver(recovery_path: Path, keep: int = 3, prefix: str = "net", lineage: str = LINEAGE) -> CheckpointSaver:
    model = torch.nn.Linear(8, 4)
    return CheckpointSaver(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                           config=CheckpointConfig(keep_checkpoint_max=keep), prefix=prefix,
                           directory=layout.rank_dir(recovery_path, 0), lineage=lineage)


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times each file's checksum was computed (by the real function)."""
    counts: Counter[str] = Counter()
    real = manifest.file_digest

    def counting(path: str | os.PathLike[str]) -> FileDigest:
        counts[Path(path).name] += 1
        return real(path)

    monkeypatch.setattr(manifest, "file_digest", counting)
    return counts


@pytest.fixture
def group() -> Iterator[None]:
    """A real one-rank gloo group, as a rollback gathers over."""
    store = dist.TCPStore("127.0.0.1", free_tcp_port(), 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_rollback_hashes_each_candidate_at_most_once(tmp_path: Path, hashed: Counter[str], group: None) -> None:
    saver = _saver(tmp_path)
    for step in (10, 20, 30):
        saver.save(TrainPosition(1, step, step))
    save_last_words(saver, tmp_path, TrainPosition(1, 35, 35), world_size=1)
    directories = checkpoint_dirs(saver, str(tmp_path), 0)

    chosen = choose_rollback(directories, LINEAGE)
    assert chosen is not None and chosen[0].path.name == "ttp_rank_0-1_35.ckpt"
    assert hashed and max(hashed.values()) == 1, hashed

    hashed.clear()
    saver.save(TrainPosition(1, 40, 40))
    chosen = choose_rollback(directories, LINEAGE)
    assert chosen is not None and chosen[0].path.name == "net-1_40.ckpt"
    assert dict(hashed) == {"net-1_40.ckpt": 1}  # the unchanged ones are known good


def test_a_file_changed_after_it_was_verified_is_verified_again(tmp_path: Path) -> None:
    saver = _saver(tmp_path)
    path = saver.save(TrainPosition(1, 1, 1))
    [candidate] = candidates(saver.directory)
    assert problem(candidate) is None
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))  # even within one clock tick
    assert problem(candidate) == "corrupt: xxh3_128 differs from the manifest"


def test_last_words_directories_are_pruned_by_the_keep_rule(tmp_path: Path) -> None:
    saver = _saver(tmp_path, keep=2)
    other = _saver(tmp_path / "elsewhere", lineage="job-b")
    for step in range(1, 6):
        save_last_words(saver, tmp_path, TrainPosition(1, step, step), world_size=2)
    # Another job's last words in the same place are not this job's to prune.
    save_last_words(other, tmp_path / "other_job", TrainPosition(1, 1, 1), world_size=1)
    names = sorted(p.parent.name for p in layout.ttp_rank_dirs(tmp_path, 1))
    assert names == ["tft_saved_checkpoints-step_4", "tft_saved_checkpoints-step_5"]
    assert sorted(os.listdir(tmp_path / layout.TTP_DIR)) == names  # nothing half-removed left


def test_checkpoints_of_earlier_incarnations_are_pruned_by_the_keep_rule(tmp_path: Path) -> None:
    step = 0
    for _incarnation in range(4):  # a rank relaunched three times, each saving three times
        saver = _saver(tmp_path, keep=2)
        for _ in range(3):
            step += 1
            saver.save(TrainPosition(1, step, step))
    directory = layout.rank_dir(tmp_path, 0)
    assert sorted(p.name for p in directory.glob("*.ckpt")) == ["net_3-1_11.ckpt", "net_3-1_12.ckpt"]


def test_pruning_spares_other_jobs_and_other_prefixes(tmp_path: Path) -> None:
    _saver(tmp_path, keep=1, lineage="job-b").save(TrainPosition(1, 1, 1))
    _saver(tmp_path, keep=1, prefix="ema").save(TrainPosition(1, 2, 2))
    mine = _saver(tmp_path, keep=1)
    for step in (3, 4):
        mine.save(TrainPosition(1, step, step))
    directory = layout.rank_dir(tmp_path, 0)
    assert sorted(p.name for p in directory.glob("*.ckpt")) == ["ema-1_2.ckpt", "net-1_1.ckpt", "net_1-1_4.ckpt"]
