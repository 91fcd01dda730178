"""Lineage at the command line: what tftrun refuses, what it hands to workers, what
``tftctl ckpt ls`` lists."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from filelock import FileLock

from launcher.cli import tftctl as ctl
from launcher.cli import tftrun as cli
from launcher.config import LaunchConfig
from launcher.procs.spec import worker_spec
from recovery import env as names
from recovery.ckpt import layout
from recovery.ckpt.checkpoint import CheckpointSaver
from recovery.ckpt.lineage import adopt_lineage, open_lineage
from recovery.env import WorkerEnv
from recovery.position import TrainPosition
from support import free_tcp_port


def save(recovery_path: Path, rank: int, step: int, lineage: str) -> Path:
    saver = CheckpointSaver(torch.nn.Linear(3, 2), directory=layout.rank_dir(recovery_path, rank),
                            prefix="mnist", lineage=lineage)
    return saver.save(TrainPosition(1, step, step))


def tftrun(tmp_path: Path, *options: str) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text("")
    return ["--worker_num=1", f"--log_dir={tmp_path / 'logs'}", f"--master_port={free_tcp_port()}",
            f"--recovery_path={tmp_path / 'recovery'}", *options, str(script)]


def test_resuming_checkpoints_that_predate_lineages_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    written = save(tmp_path / "recovery", 0, 5, "unrecorded")  # no lineage file: as before lineages
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker_0.log").write_text("the earlier run's log")
    assert cli.main(tftrun(tmp_path, "--is_recover=1")) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("tftrun: error: --is_recover=1: ")
    assert "records no lineage" in line and "start without --is_recover" in line
    assert "another --recovery_path" in line
    assert written.is_file() and (tmp_path / "logs" / "worker_0.log").is_file()  # nothing moved


def test_a_recovery_path_in_use_by_another_tftrun_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "recovery").mkdir()
    with FileLock(str(tmp_path / "recovery" / cli.LOCK_FILE)):
        assert cli.main(tftrun(tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tftrun: error: another tftrun job is using --recovery_path {tmp_path / 'recovery'}"]


def test_workers_get_the_lineage_in_the_env_contract(tmp_path: Path) -> None:
    config = LaunchConfig(script=tmp_path / "train.py", worker_num=2, lineage="0123abcd")
    env = worker_spec(config, 1, 0, 0, 1234, base_env={}).env
    assert env[names.TFT_LINEAGE] == "0123abcd"
    assert WorkerEnv.from_env(env).lineage == "0123abcd"


def test_ckpt_ls_lists_the_current_lineage_and_all_lists_every_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    earlier = adopt_lineage(tmp_path)
    save(tmp_path, 0, 100, earlier)
    current = open_lineage(tmp_path, resume=False).lineage  # moves the earlier job aside
    for rank in (0, 1):
        save(tmp_path, rank, 20, current)
    save(tmp_path, 1, 40, "someone-else")  # e.g. a stray copy into this job's directory

    assert ctl.main(["ckpt", "ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if ".ckpt" in line]
    assert len(rows) == 2 and all(current in row and "mnist-1_20.ckpt" in row for row in rows)
    assert f"lineage {current}; 2 checkpoint(s) of other lineages not listed (--all lists them)" in out

    # From a rank's directory the recovery path's lineage is found above it.
    assert ctl.main(["ckpt", "ls", str(layout.rank_dir(tmp_path, 1))]) == 0
    assert sum(".ckpt" in line for line in capsys.readouterr().out.splitlines()) == 1

    assert ctl.main(["ckpt", "ls", "--all", str(tmp_path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if ".ckpt" in line]
    assert len(rows) == 4
    assert any(earlier in row and "previous/1/checkpoints/rank_0/mnist-1_100.ckpt" in row for row in rows)
