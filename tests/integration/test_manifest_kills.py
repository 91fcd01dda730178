"""A save killed (SIGKILL, in a forked child) before any one of its system calls leaves a
consistent manifest; the manifest lock excludes another process."""

from __future__ import annotations

import fcntl
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from recovery.ckpt import layout
from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver, write_checkpoint
from recovery.ckpt.manifest import Manifest, candidates, newest_valid, problem
from recovery.position import TrainPosition
from support.manifests import manifest_entry

# Every call a save makes that changes the disk or orders it: a kill before any one of them.
_CALLS = ("open", "fsync", "replace", "rename", "link", "unlink", "close")


@contextmanager
def _kill_before_call(number: int) -> Iterator[list[str]]:
    """SIGKILL this process just before its ``number``-th call (from 1) of :data:`_CALLS`;
    yields the calls made, by name."""
    made: list[str] = []
    originals = {name: getattr(os, name) for name in _CALLS}

    def hooked(name: str, call: Callable[..., object]) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            made.append(name)
            if len(made) == number:
                os.kill(os.getpid(), signal.SIGKILL)
            return call(*args, **kwargs)
        return run

    for name, call in originals.items():
        setattr(os, name, hooked(name, call))
    try:
        yield made
    finally:
        for name, call in originals.items():
            setattr(os, name, call)


def _saver(directory: Path) -> CheckpointSaver:
    return CheckpointSaver(torch.nn.Linear(8, 8), directory=directory, prefix="net",
                           config=CheckpointConfig(keep_checkpoint_max=2))


def _third_save(directory: Path, kill_at: int) -> int:
    """In a forked child: the third save of a saver keeping two, killed before call
    ``kill_at``; returns the calls it made when not killed, else its exit signal."""
    saver = _saver(directory)
    for step in (1, 2):
        saver.save(TrainPosition(1, step, step))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only the save, then out without any clean-up of pytest's
        os.close(read)
        try:
            with _kill_before_call(kill_at) as made:
                position = TrainPosition(1, 3, 3)
                write_checkpoint(directory, layout.checkpoint_name("net", position), saver.state(position),
                                 position, Manifest(directory), keep=saver.keep_rule)
            os.write(write, str(len(made)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        calls = pipe.read()
    _, status = os.waitpid(pid, 0)
    return int(calls) if calls else -os.WTERMSIG(status)


def test_a_save_killed_before_any_system_call_leaves_a_consistent_manifest(tmp_path: Path) -> None:
    calls = _third_save(tmp_path / "whole", kill_at=0)  # never killed: counts the calls
    assert calls > 10
    for kill_at in range(1, calls + 1):
        directory = tmp_path / str(kill_at)
        assert _third_save(directory, kill_at) == -signal.SIGKILL
        listed = sorted(Manifest(directory).entries())
        # One update both lists the new file and forgets the oldest: never one without the other.
        assert listed in (["net-1_1.ckpt", "net-1_2.ckpt"], ["net-1_2.ckpt", "net-1_3.ckpt"]), kill_at
        for candidate in candidates(directory):
            if candidate.entry is not None:  # every listed file is there, whole
                assert problem(candidate) is None, (kill_at, candidate.path.name)
        found = newest_valid(directory)
        assert found is not None and found[0].path.name == listed[-1], kill_at
        # The next saver clears what the dead one left but for files it had not unlinked yet.
        _saver(directory)
        assert not [name for name in os.listdir(directory) if layout.temp_owner_pid(name) is not None]


def test_an_update_waits_for_another_process_holding_the_manifests_lock(tmp_path: Path) -> None:
    manifest = Manifest(tmp_path)
    read, write = os.pipe()
    release_read, release_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            fd = os.open(layout.manifest_lock_path(tmp_path), os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(write, b"held")
            os.read(release_read, 1)  # until the test lets go (or dies: end of file)
        finally:
            os._exit(0)
    os.close(write)
    os.close(release_read)
    try:
        assert os.read(read, 4) == b"held"
        done = threading.Event()
        adder = threading.Thread(target=lambda: (manifest.add(manifest_entry("net-1_1.ckpt", 1)), done.set()))
        adder.start()
        assert not done.wait(0.3)  # blocked on the other process's lock
        assert manifest.entries() == {}
        os.write(release_write, b"x")
        assert done.wait(30)
        adder.join()
    finally:
        os.close(release_write)
        os.close(read)
        os.waitpid(pid, 0)
    assert list(manifest.entries()) == ["net-1_1.ckpt"]
