"""The folder check of a job started without tftrun (recovery/runtime/folders.py): the log
dir and the recovery path its environment names, refused as tftrun refuses them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recovery import env as names
from recovery.runtime.folders import folder_refusal


@pytest.mark.parametrize("variable", [names.TFT_LOG_DIR, names.MS_RECOVERY_PATH])
@pytest.mark.parametrize("how", ["world-writable", "group-writable", "linked to a shared one",
                                 "another user's"])
def test_a_folder_another_user_could_plant_links_in_is_refused(
        tmp_path: Path, variable: str, how: str) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    named = folder
    if how == "world-writable":
        folder.chmod(0o777)
    elif how == "group-writable":
        folder.chmod(0o770)
    elif how == "linked to a shared one":
        folder.chmod(0o1777)  # the sticky bit does not make a shared folder the user's own
        named = tmp_path / "link"
        named.symlink_to(folder)
    elif os.getuid() == 0:
        os.chown(folder, 65534, 65534)
    else:
        pytest.skip("making a folder another user's needs root")
    refusal = folder_refusal({variable: str(named)})
    assert refusal is not None and refusal.startswith(f"{variable} {named}: "), refusal


def test_the_users_own_folders_and_folders_not_made_yet_pass(tmp_path: Path) -> None:
    own = tmp_path / "logs"
    own.mkdir(mode=0o755)
    assert folder_refusal({names.TFT_LOG_DIR: str(own),
                           names.MS_RECOVERY_PATH: str(tmp_path / "not yet")}) is None
    assert folder_refusal({}) is None
