"""recovery.train.collectives over real gloo ranks: ragged integer rows gathered, state
broadcast, a malicious payload refused."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from recovery import env as envnames
from support import BIN, run_together


def test_rows_are_gathered_and_state_is_broadcast(free_port: int) -> None:
    base = {**os.environ, envnames.WORLD_SIZE: "3", envnames.MASTER_ADDR: "127.0.0.1",
            envnames.MASTER_PORT: str(free_port)}
    base.pop(envnames.TORCHELASTIC_USE_AGENT_STORE, None)
    results = run_together([[sys.executable, str(BIN / "collectives_rank.py")]] * 3, timeout=90,
                           envs=[{**base, envnames.RANK: str(rank)} for rank in range(3)])
    for rank, (status, out, err) in enumerate(results):
        assert status == 0, err
        got = json.loads(out)
        assert got["rows"] == [[], [[1, 0]], [[2, 0], [2, 1]]]
        assert got["weights"] == [0.0, 1.5, 3.0, 4.5, 6.0] and got["step"] == 39
        assert got["same_object"] == (rank == 1)


def test_a_peer_sending_a_pickle_that_runs_code_or_announcing_more_than_memory_is_refused(
        free_port: int, tmp_path: Path) -> None:
    marker = tmp_path / "the payload ran"
    base = {**os.environ, envnames.WORLD_SIZE: "2", envnames.MASTER_ADDR: "127.0.0.1",
            envnames.MASTER_PORT: str(free_port)}
    base.pop(envnames.TORCHELASTIC_USE_AGENT_STORE, None)
    results = run_together([[sys.executable, str(BIN / "pickle_attack.py"), str(marker)]] * 2,
                           timeout=90, envs=[{**base, envnames.RANK: str(rank)} for rank in range(2)])
    for status, _, err in results:
        assert status == 0, err
    assert not marker.exists()
    assert json.loads(results[1][1]) == ["refused RefusedPayload"] * 3


@pytest.mark.parametrize("exchange, refusal", [
    ("rows", r"rank 0 announced 100000 rows; a rank sends at most 1$"),
    ("state", r"rank 0 announced 1677\d{4} bytes; this rank accepts at most \d{6,7} "),
])
def test_a_peer_announcing_more_than_an_honest_one_sends_is_refused_before_allocating(
        free_port: int, exchange: str, refusal: str) -> None:
    """100 000 report rows where each rank sends one; a 16 MiB state to a rank whose own
    is a few hundred bytes: refused with a clear error, nothing loaded."""
    base = {**os.environ, envnames.WORLD_SIZE: "2", envnames.MASTER_ADDR: "127.0.0.1",
            envnames.MASTER_PORT: str(free_port)}
    base.pop(envnames.TORCHELASTIC_USE_AGENT_STORE, None)
    results = run_together([[sys.executable, str(BIN / "oversize_attack.py"), exchange]] * 2,
                           timeout=90, envs=[{**base, envnames.RANK: str(rank)} for rank in range(2)])
    for status, _, err in results:
        assert status == 0, err
    outcome = json.loads(results[1][1])
    assert re.match(f"refused RefusedPayload: {refusal}", outcome), outcome
