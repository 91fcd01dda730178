"""Fixtures of the unit tests: torch's own TCPStore server, on a free port."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from torch.distributed import TCPStore


@pytest.fixture
def store() -> Iterator[TCPStore]:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=10))
    yield server
    del server
