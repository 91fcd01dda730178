"""Fixtures of the unit tests: a unit test starts no process (tests/integration holds those),
and torch's own TCPStore server, on a free port."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
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
