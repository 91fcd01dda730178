"""Folders another user could turn against the job (issues 26 and 38): tftrun refuses a
log dir or a recovery path that another user owns or may write into, or that lies in a
folder another user could replace it in (one line, exit 2, nothing started), resolves
them once, and writes through no link planted in one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.cli import tftrun
from launcher.config import LaunchConfig, with_own_folders
from launcher.procs.process import open_log
from launcher.procs.spec import error_file, prepare_error_file, worker_spec
from recovery import env as names
from recovery.ckpt.durable import write_atomic


def run(tmp_path: Path, *args: str) -> int:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('started')\n")
    return tftrun.main(["--worker_num=1", *args, str(script)])


def _make_unsafe(folder: Path, writable: bool) -> None:
    """``folder`` writable by others, or (as root) another user's."""
    if writable:
        folder.chmod(0o777)
    elif os.getuid() == 0:
        os.chown(folder, 65534, 65534)
    else:
        pytest.skip("making a folder another user's needs root")


def _refused_line(tmp_path: Path, option: str, folder: Path,
                  capsys: pytest.CaptureFixture[str]) -> str:
    """tftrun with ``option`` at ``folder`` exits 2 with one line on stderr: that line."""
    others = {"--log_dir": f"--log_dir={tmp_path / 'logs'}",
              "--recovery_path": f"--recovery_path={tmp_path / 'rec'}"}
    others[option] = f"{option}={folder}"
    assert run(tmp_path, *others.values()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("option", ["--log_dir", "--recovery_path"])
@pytest.mark.parametrize("how", ["world-writable", "another user's"])
def test_a_shared_or_foreign_folder_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, how: str) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    _make_unsafe(folder, writable=how == "world-writable")
    err = _refused_line(tmp_path, option, folder, capsys)
    assert option in err and str(folder) in err, err
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


@pytest.mark.parametrize("option", ["--log_dir", "--recovery_path"])
@pytest.mark.parametrize("how", ["writable by others", "another user's"])
def test_a_folder_inside_one_another_user_could_replace_it_in_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, how: str) -> None:
    """The folder itself is the user's own, but a folder on its way is not."""
    way = tmp_path / "way"
    folder = way / "mine"
    folder.mkdir(parents=True)
    _make_unsafe(way, writable=how == "writable by others")
    err = _refused_line(tmp_path, option, folder, capsys)
    assert option in err and f"it lies in {way}," in err, err
    assert not list(folder.iterdir())


def test_a_sticky_folder_on_the_way_is_fine_and_the_path_is_resolved_once(tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    (sticky / "real" / "logs").mkdir(parents=True)
    (sticky / "real" / "rec").mkdir()
    sticky.chmod(0o1777)
    (tmp_path / "link").symlink_to(sticky / "real")
    config = LaunchConfig(script=tmp_path / "t.py", log_dir=tmp_path / "link" / "logs",
                          recovery_path=tmp_path / "link" / "rec")
    settled = with_own_folders(config)
    assert (settled.log_dir, settled.recovery_path) == (sticky / "real" / "logs", sticky / "real" / "rec")
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to(tmp_path)
    assert worker_spec(settled, 0, 0, 0, 1).env[names.TFT_LOG_DIR] == str(sticky / "real" / "logs")
    assert error_file(settled, 0).parent == sticky / "real" / "logs" / "errors"


def test_the_error_files_folder_is_made_by_tftrun_and_a_link_in_its_place_refused(
        tmp_path: Path) -> None:
    config = LaunchConfig(script=tmp_path / "t.py", log_dir=tmp_path)
    prepare_error_file(config, 0)
    assert (tmp_path / "errors").is_dir() and not (tmp_path / "errors").is_symlink()
    (tmp_path / "errors").rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "worker_0.json").write_text("kept")
    (tmp_path / "errors").symlink_to(elsewhere)
    with pytest.raises(OSError, match="symbolic link"):
        prepare_error_file(config, 0)
    assert (elsewhere / "worker_0.json").read_text() == "kept"
