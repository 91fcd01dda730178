"""Another writer's update is never lost to the manifest's parse cache; a damaged manifest
and a volume without ``flock`` (the kills and the lock between processes:
tests/integration/test_manifest_kills.py)."""

from __future__ import annotations

import errno
import fcntl
from pathlib import Path

import pytest

from recovery.ckpt.manifest import KeepRule, Manifest
from support.manifests import manifest_entry


def test_another_writers_update_is_seen_by_a_manifest_that_parsed_the_file_before(tmp_path: Path) -> None:
    ours, theirs = Manifest(tmp_path), Manifest(tmp_path)
    ours.add(manifest_entry("net-1_1.ckpt", 1))
    theirs.add(manifest_entry("net-1_2.ckpt", 2))
    keep_one = KeepRule("net", "job", 1)
    # The keep rule is asked with the other writer's entry, read under the lock.
    assert ours.add(manifest_entry("net-1_3.ckpt", 3), keep=keep_one) == ["net-1_1.ckpt", "net-1_2.ckpt"]
    assert list(theirs.entries()) == ["net-1_3.ckpt"]
    assert theirs.entries()["net-1_3.ckpt"].seq == 3
    entries = ours.entries()
    entries.clear()  # a copy: the manifest's own record is untouched
    assert list(ours.entries()) == ["net-1_3.ckpt"]


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"version": 1}'])
def test_a_damaged_manifest_after_a_good_read_trusts_no_file(tmp_path: Path, damage: bytes) -> None:
    manifest = Manifest(tmp_path)
    manifest.add(manifest_entry("net-1_1.ckpt", 1))
    assert list(manifest.entries()) == ["net-1_1.ckpt"]
    manifest.path.write_bytes(damage)
    assert manifest.entries() == {}


def test_without_flock_the_manifest_is_updated_under_filelocks_fallback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """As on Lustre mounted without ``flock``: every ``flock`` fails with ENOSYS."""
    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    manifest = Manifest(tmp_path)
    with pytest.warns(UserWarning, match="flock not supported"):
        manifest.add(manifest_entry("net-1_1.ckpt", 1))
    manifest.add(manifest_entry("net-1_2.ckpt", 2), keep=KeepRule("net", "job", 1))
    assert list(Manifest(tmp_path).entries()) == ["net-1_2.ckpt"]
