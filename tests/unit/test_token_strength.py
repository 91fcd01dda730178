"""The job token (issue 26): a user-set one too short to resist an offline guess is
refused unless the user opts in, and it never shows in a repr."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.cli import tftrun
from launcher.cli.trusted import TrustedEndpoint
from launcher.config import LaunchConfig
from recovery.control.files import Endpoint
from recovery.control.scheduler import SchedulerConfig
from recovery.control.signing import WeakToken, checked_strength
from recovery.env import WorkerEnv

STRONG = "f0e1d2c3b4a5968778695a4b3c2d1e0f"


@pytest.mark.parametrize("token", ["abc", "0123456789abcdef0123456789abcde", "short-secret"])
def test_a_token_under_128_bits_is_refused_unless_the_user_opts_in(token: str) -> None:
    with pytest.raises(WeakToken, match="TFT_INSECURE_WEAK_TOKEN=1"):
        checked_strength(token, allow_weak=False)
    assert checked_strength(token, allow_weak=True) == token


@given(st.binary(min_size=16, max_size=40))
def test_a_token_made_as_the_docs_say_is_accepted(raw: bytes) -> None:
    assert checked_strength(raw.hex(), allow_weak=False) == raw.hex()
    assert checked_strength("", allow_weak=False) == ""  # no token: checked_token's business


def test_tftrun_refuses_a_weak_token_in_one_line_and_starts_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('started')\n")
    monkeypatch.setenv("TFT_JOB_TOKEN", "abc")
    assert tftrun.main(["--worker_num=1", f"--log_dir={tmp_path / 'logs'}", str(script)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "128 bits" in err[0]
    assert not [p for p in (tmp_path / "logs").glob("*") if p.suffix in (".log", ".jsonl")]


def test_the_token_shows_in_no_repr(tmp_path: Path) -> None:
    worker = WorkerEnv.from_env({"TFT_JOB_TOKEN": STRONG})
    config = LaunchConfig(script=tmp_path / "t.py", job_token=STRONG)
    sched = SchedulerConfig.from_env({"TFT_JOB_TOKEN": STRONG, "MS_SCHED_PORT": "1"})
    trusted = TrustedEndpoint(Endpoint("127.0.0.1", 1, 1, "r", 0.0), STRONG)
    for thing in (worker, config, sched, trusted):
        assert STRONG not in repr(thing) and STRONG not in str(thing)
