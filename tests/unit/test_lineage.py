"""Job lineage: only the current lineage's checkpoints are candidates, and a recovery path
moves an earlier job's state aside instead of mixing it in."""

from __future__ import annotations

import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery import env as names
from recovery.ckpt import last_words, layout
from recovery.ckpt.checkpoint import CheckpointSaver
from recovery.ckpt.lineage import (
    LineageError,
    adopt_lineage,
    job_lineage,
    main,
    open_lineage,
    read_lineage,
    record_lineage,
)
from recovery.ckpt.manifest import CheckpointEntry, CheckpointKind, Manifest, candidates, newest_valid
from recovery.ckpt.restore import load_checkpoint, resume
from recovery.position import TrainPosition


def saver_of(directory: Path, lineage: str, seed: int = 0) -> CheckpointSaver:
    torch.manual_seed(seed)
    return CheckpointSaver(torch.nn.Linear(4, 2), directory=directory, prefix="net", lineage=lineage)


def strip_lineage(directory: Path) -> None:
    """Rewrite the manifest as tftrun wrote it before lineages existed: no lineage, no kind."""
    manifest = layout.manifest_path(directory)
    content = json.loads(manifest.read_text())
    for entry in content["entries"]:
        del entry["lineage"], entry["kind"]
    manifest.write_text(json.dumps(content))


# ------------------------------------------------------------------ candidates, resume
def test_candidates_of_a_lineage_leave_out_every_other_and_the_pre_lineage_ones(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy"
    saver_of(legacy, "old").save(TrainPosition(1, 9, 9))
    strip_lineage(legacy)
    [entry] = Manifest(legacy).entries().values()
    assert entry.lineage is None and entry.kind is CheckpointKind.PERIODIC

    shared = tmp_path / "shared"
    saver_of(shared, "aaaa").save(TrainPosition(1, 30, 30))
    saver_of(shared, "bbbb").save(TrainPosition(1, 10, 10))
    (shared / "stray-1_50.ckpt").write_bytes(b"never listed")
    assert [c.step_in_epoch for c in candidates(shared)] == [50, 30, 10]
    lineages = [(c.step_in_epoch, c.entry and c.entry.lineage) for c in candidates(shared, "bbbb")]
    assert lineages == [(50, None), (10, "bbbb")]
    assert candidates(legacy, "old") == []


_LINEAGES = st.sampled_from(["aaaa", "bbbb", None])  # None: written before lineages existed


@settings(max_examples=40, deadline=None)
@given(files=st.lists(st.tuples(st.integers(0, 50), _LINEAGES, st.booleans()), max_size=6),
       wanted=st.sampled_from(["aaaa", "bbbb"]))
def test_a_lineages_candidates_are_exactly_its_entries_and_the_unlisted_files(
        files: list[tuple[int, str | None, bool]], wanted: str) -> None:
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        for index, (step, lineage, listed) in enumerate(files):
            file = f"net{index}-1_{step}.ckpt"
            (directory / file).write_bytes(b"x")
            if listed:
                Manifest(directory).add(CheckpointEntry(file, 1, step, step, 0, 1, 1, "0" * 32, 0.0,
                                                        lineage=lineage))
        every = candidates(directory)
        chosen = candidates(directory, wanted)
        assert chosen == [c for c in every if c.entry is None or c.entry.lineage == wanted]
        assert [c.order for c in chosen] == sorted((c.order for c in chosen), reverse=True)
        assert all(c.kind is (None if c.entry is None else CheckpointKind.PERIODIC) for c in chosen)


def test_newest_valid_and_resume_pick_the_current_lineage_even_when_another_is_newer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = saver_of(tmp_path, "mine", seed=1)
    mine.save(TrainPosition(1, 4, 4))
    saver_of(tmp_path, "theirs", seed=2).save(TrainPosition(1, 120, 120))
    found = newest_valid(tmp_path, "mine")
    assert found is not None and found[0].step_in_epoch == 4 and found[1]["lineage"] == "mine"
    other = saver_of(tmp_path, "mine", seed=3)
    assert other.resume().global_step == 4
    assert torch.equal(other.model.weight, mine.model.weight)
    # A resume with no lineage given uses this process's: TFT_LINEAGE here.
    monkeypatch.setenv(names.TFT_LINEAGE, "theirs")
    assert resume(tmp_path, torch.nn.Linear(4, 2)).global_step == 120


def test_a_checkpoint_and_its_manifest_entry_carry_the_lineage_and_kind(tmp_path: Path) -> None:
    path = saver_of(tmp_path, "cafe01").save(TrainPosition(1, 2, 2))
    assert load_checkpoint(path)["lineage"] == "cafe01"
    [candidate] = candidates(tmp_path)
    assert candidate.entry is not None and candidate.entry.lineage == "cafe01"
    assert candidate.kind is CheckpointKind.PERIODIC


# ------------------------------------------------------------------ last words
def test_last_words_are_of_their_kind_and_their_step_directory_records_the_lineage(tmp_path: Path) -> None:
    saver = saver_of(tmp_path / "periodic", "cafe02")
    step_dir = last_words.save_last_words(saver, tmp_path, TrainPosition(1, 7, 7), world_size=2)
    assert read_lineage(step_dir) == "cafe02"
    for rank in range(2):
        [candidate] = candidates(layout.ttp_checkpoint_path(tmp_path, rank, TrainPosition(1, 7, 7)).parent, "cafe02")
        assert candidate.kind is CheckpointKind.LAST_WORDS


def test_another_lineages_last_words_of_the_same_step_are_moved_aside_not_reused(tmp_path: Path) -> None:
    position = TrainPosition(1, 7, 7)
    theirs = last_words.save_last_words(saver_of(tmp_path / "a", "theirs"), tmp_path, position, 1)
    mine = last_words.save_last_words(saver_of(tmp_path / "b", "mine"), tmp_path, position, 1)
    assert mine == theirs and read_lineage(mine) == "mine"
    moved = layout.previous_dir(tmp_path) / "1" / mine.relative_to(tmp_path)
    assert read_lineage(moved) == "theirs"
    # Saved again at the same step by the same job: the complete directory is kept.
    assert last_words.save_last_words(saver_of(tmp_path / "b", "mine"), tmp_path, position, 1) == mine
    assert len(os.listdir(layout.previous_dir(tmp_path))) == 1


# ------------------------------------------------------------------ the recovery path
def test_processes_started_together_by_hand_adopt_one_lineage(tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool:
        adopted = set(pool.map(lambda _: adopt_lineage(tmp_path), range(32)))
    assert adopted == {read_lineage(tmp_path)}
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_the_lineage_tftrun_passes_wins_and_a_malformed_one_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record_lineage(tmp_path, "on-disk")
    monkeypatch.setenv(names.MS_RECOVERY_PATH, str(tmp_path))
    assert job_lineage() == "on-disk"
    monkeypatch.setenv(names.TFT_LINEAGE, "from-tftrun")
    assert job_lineage() == "from-tftrun"
    monkeypatch.setenv(names.TFT_LINEAGE, "../etc")
    with pytest.raises(LineageError, match="TFT_LINEAGE does not hold a lineage id"):
        job_lineage()


def _earlier_job(recovery_path: Path) -> str:
    lineage = adopt_lineage(recovery_path)
    saver_of(layout.rank_dir(recovery_path, 0), lineage).save(TrainPosition(1, 5, 5))
    last_words.save_last_words(saver_of(layout.rank_dir(recovery_path, 0), lineage), recovery_path,
                               TrainPosition(1, 6, 6), 1)
    (recovery_path / "scheduler").mkdir()
    (recovery_path / "scheduler" / "state.json").write_text("{}")
    (recovery_path / "notes.txt").write_text("the user's own file")
    return lineage


def test_a_fresh_launch_moves_the_earlier_job_to_previous_and_starts_a_new_lineage(tmp_path: Path) -> None:
    earlier = _earlier_job(tmp_path)
    opened = open_lineage(tmp_path, resume=False)
    assert opened.lineage != earlier and read_lineage(tmp_path) == opened.lineage
    assert opened.archived == tmp_path / "previous" / "1"
    assert sorted(os.listdir(opened.archived)) == ["checkpoints", "lineage", "scheduler", "ttp_checkpoints"]
    assert read_lineage(opened.archived) == earlier
    assert (layout.rank_dir(opened.archived, 0) / "net-1_5.ckpt").is_file()
    assert sorted(os.listdir(tmp_path)) == ["lineage", "notes.txt", "previous"]
    # The next fresh launch, with nothing written in between, has nothing to move.
    unused = open_lineage(tmp_path, resume=False)
    assert unused.archived is None and unused.lineage != opened.lineage
    saver_of(layout.rank_dir(tmp_path, 0), unused.lineage).save(TrainPosition(1, 1, 1))
    assert open_lineage(tmp_path, resume=False).archived == tmp_path / "previous" / "2"


def test_a_fresh_launch_after_a_job_without_checkpoints_moves_nothing(tmp_path: Path) -> None:
    earlier = adopt_lineage(tmp_path)
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "state.json").write_text("{}")
    opened = open_lineage(tmp_path, resume=False)
    assert opened.archived is None and opened.lineage != earlier
    assert sorted(os.listdir(tmp_path)) == ["lineage", "scheduler"]


def test_a_resume_keeps_the_lineage(tmp_path: Path) -> None:
    earlier = _earlier_job(tmp_path)
    opened = open_lineage(tmp_path, resume=True)
    assert (opened.lineage, opened.archived) == (earlier, None)
    assert newest_valid(layout.rank_dir(tmp_path, 0), opened.lineage) is not None


def test_a_resume_of_checkpoints_without_a_lineage_is_refused_and_of_nothing_starts_one(tmp_path: Path) -> None:
    assert open_lineage(tmp_path / "empty", resume=True).lineage == read_lineage(tmp_path / "empty")
    _earlier_job(tmp_path)
    layout.lineage_file(tmp_path).unlink()
    with pytest.raises(LineageError, match="holds checkpoints but records no lineage"):
        open_lineage(tmp_path, resume=True)
    assert (layout.rank_dir(tmp_path, 0) / "net-1_5.ckpt").is_file()


def test_launch_scripts_open_the_lineage_as_tftrun_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    earlier = _earlier_job(tmp_path)
    assert main(["resume", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{earlier}\n"
    assert main(["new", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{read_lineage(tmp_path)}\n" != f"{earlier}\n"
    assert err.strip() == f"an earlier job's checkpoints in {tmp_path} were moved to {tmp_path / 'previous' / '1'}"
    assert main(["again", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("usage: python -m recovery.ckpt.lineage new|resume")
