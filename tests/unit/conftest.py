"""Fixtures of the unit tests: a unit test starts no process (tests/integration holds those),
torch's own TCPStore server, on a free port, and a gloo group of one rank in this process."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed import TCPStore

from support.process_starts import process_starts


@pytest.fixture(autouse=True)
def no_process_started() -> Iterator[None]:
    """Fail a unit test that started a process, itself or through the code it tests."""
    with process_starts() as started:
        yield
    assert not started, f"a unit test started processes ({', '.join(started)}): move it to tests/integration"


@pytest.fixture
def store() -> Iterator[TCPStore]:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=10))
    yield server
    del server


@pytest.fixture
def alone() -> Iterator[None]:
    """A gloo group of one rank in this process, the default group while the test runs."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()
