"""Folders another user could turn against the job (issue 26): tftrun refuses a log dir
or a recovery path that another user owns or may write into (one line, exit 2, nothing
started), and writes through no link planted in one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.cli import tftrun
from launcher.procs.process import open_log
from recovery.ckpt.durable import write_atomic


def run(tmp_path: Path, *args: str) -> int:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('started')\n")
    return tftrun.main(["--worker_num=1", *args, str(script)])


@pytest.mark.parametrize("option", ["--log_dir", "--recovery_path"])
@pytest.mark.parametrize("how", ["world-writable", "another user's"])
def test_a_shared_or_foreign_folder_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, how: str) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    if how == "world-writable":
        folder.chmod(0o777)
    elif os.getuid() == 0:
        os.chown(folder, 65534, 65534)
    else:
        pytest.skip("making a folder another user's needs root")
    others = {"--log_dir": f"--log_dir={tmp_path / 'logs'}",
              "--recovery_path": f"--recovery_path={tmp_path / 'rec'}"}
    others[option] = f"{option}={folder}"
    assert run(tmp_path, *others.values()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and option in err[0] and str(folder) in err[0], err
    assert not list(folder.iterdir())


def test_no_log_nor_temporary_file_is_written_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "bashrc"
    victim.write_text("mine\n")
    (tmp_path / "worker_0.log").symlink_to(victim)
    with pytest.raises(OSError):
        open_log(tmp_path / "worker_0.log", "header")
    target = tmp_path / "state.json"
    write_atomic(target, lambda file: file.write(b"{}"))
    assert target.read_bytes() == b"{}" and victim.read_text() == "mine\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
