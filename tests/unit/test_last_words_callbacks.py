"""The parts of the framework callbacks (recovery.lightning, recovery.hf) that decide and
write: what counts as a dead peer, the SIGTERM flag, and the Hugging Face folder's atomic
replacement. Their behaviour under a real kill -9 is tests/integration/test_frameworks.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch.distributed as dist

from recovery.peer_loss import StopRequest, first_line, is_peer_loss

GLOO_RESET = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[127.0.0.1]:33674: Connection reset by peer.")


def test_a_collective_on_a_dead_peer_is_a_peer_loss() -> None:
    assert is_peer_loss(RuntimeError(GLOO_RESET))
    assert is_peer_loss(RuntimeError("[../pair.cc:553] Connection closed by peer [127.0.0.1]:902"))
    assert is_peer_loss(dist.DistBackendError("NCCL communicator was aborted on rank 0"))


def test_a_wrapped_peer_loss_is_seen_through_its_cause() -> None:
    try:
        try:
            raise RuntimeError(GLOO_RESET)
        except RuntimeError as err:
            raise ValueError("the step failed") from err
    except ValueError as wrapped:
        assert is_peer_loss(wrapped)


def test_other_errors_are_not_a_peer_loss() -> None:
    assert not is_peer_loss(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_peer_loss(ValueError("Connection reset by peer"))  # not what a collective raises
    assert not is_peer_loss(KeyboardInterrupt())


def test_sigterm_only_sets_the_flag_until_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    stop = StopRequest()
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_default_action_is_given_back_when_no_sigterm_came() -> None:
    before = signal.getsignal(signal.SIGTERM)
    stop = StopRequest()
    stop.install()
    try:
        stop.default_action()  # returns: no SIGTERM is pending
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


def _files(path: Path) -> dict[str, str]:
    return {f.name: f.read_text() for f in path.iterdir()}


def _write(files: dict[str, str]):
    def write(folder: Path) -> None:
        for name, text in files.items():
            (folder / name).write_text(text)
    return write


def test_a_folder_replaces_the_old_one_whole(tmp_path: Path) -> None:
    hf = pytest.importorskip("recovery.hf")
    target = tmp_path / "checkpoint-15"
    hf.write_dir_atomic(target, _write({"model": "old", "torn": "x"}))
    hf.write_dir_atomic(target, _write({"model": "new"}))
    assert _files(target) == {"model": "new"}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-15"]  # no temporary folder left


def test_a_failed_write_keeps_the_old_folder(tmp_path: Path) -> None:
    hf = pytest.importorskip("recovery.hf")
    target = tmp_path / "checkpoint-15"
    hf.write_dir_atomic(target, _write({"model": "old"}))

    def fail(folder: Path) -> None:
        (folder / "model").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        hf.write_dir_atomic(target, fail)
    assert _files(target) == {"model": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-15"]


def test_a_folder_another_writer_puts_in_place_meanwhile_is_replaced(tmp_path: Path) -> None:
    hf = pytest.importorskip("recovery.hf")
    target = tmp_path / "checkpoint-15"

    def racing(folder: Path) -> None:
        target.mkdir()  # another survivor's last words land while this one writes
        (target / "model").write_text("other")
        (folder / "model").write_text("mine")

    hf.write_dir_atomic(target, racing)
    assert _files(target) == {"model": "mine"}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-15"]


def test_the_log_line_names_the_error_in_one_line() -> None:
    assert first_line(RuntimeError(GLOO_RESET + "\nThis is typically caused by")) == f"RuntimeError: {GLOO_RESET}"
    assert first_line(dist.DistBackendError("")) == "DistBackendError: "
