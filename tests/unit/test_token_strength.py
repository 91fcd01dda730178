"""The job token (issues 26 and 38): a user-set one that is not hex of 128 bits or
base64url of as much is refused unless the user opts in, and it never shows in a repr."""

from __future__ import annotations

import base64
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.cli import tftrun
from launcher.cli.trusted import TrustedEndpoint
from launcher.config import LaunchConfig
from recovery.control.files import Endpoint
from recovery.control.scheduler_config import SchedulerConfig
from recovery.control.signing import WeakToken, checked_strength
from recovery.env import WorkerEnv

STRONG = "f0e1d2c3b4a5968778695a4b3c2d1e0f"
HEX = "0123456789abcdefABCDEF"
BASE64URL = string.ascii_letters + string.digits + "-_"


@pytest.mark.parametrize("token", ["abc", "0123456789abcdef0123456789abcde", "short-secret",
                                   "hunter2!hunter2!", "correct horse battery staple",
                                   "a2V5LWtleS1rZXktaz=", STRONG + "\n"])
def test_a_token_not_of_the_form_is_refused_unless_the_user_opts_in(token: str) -> None:
    with pytest.raises(WeakToken, match="TFT_INSECURE_WEAK_TOKEN=1"):
        checked_strength(token, allow_weak=False)
    assert checked_strength(token, allow_weak=True) == token


@given(st.binary(min_size=16, max_size=40))
def test_a_token_made_as_the_docs_say_is_accepted(raw: bytes) -> None:
    encoded = (base64.urlsafe_b64encode(raw).decode(), base64.b64encode(raw).decode())
    for token in (raw.hex(), raw.hex().upper(), *encoded, *(text.rstrip("=") for text in encoded)):
        if set(token) <= set(HEX) and len(token) < 32:
            continue  # base64 that reads as hex digits only is counted as hex (below)
        assert checked_strength(token, allow_weak=False) == token
    assert checked_strength("", allow_weak=False) == ""  # no token: checked_token's business


def strong(token: str) -> bool:
    try:
        checked_strength(token, allow_weak=False)
    except WeakToken:
        return False
    return True


@given(st.text(HEX, min_size=1, max_size=64))
def test_hex_is_accepted_from_32_digits(token: str) -> None:
    assert strong(token) == (len(token) >= 32)


@given(st.text(BASE64URL, min_size=1, max_size=40).filter(lambda t: set(t) - set(HEX)),
       st.integers(0, 2))
def test_base64url_is_accepted_from_22_characters_padding_not_counted(token: str, pad: int) -> None:
    assert strong(token + "=" * pad) == (len(token) >= 22)


@given(st.text(min_size=1, max_size=80).filter(
    lambda t: set(t) - set(BASE64URL + "+/=")))
def test_any_other_character_is_refused_whatever_the_length(token: str) -> None:
    assert not strong(token)


@pytest.mark.parametrize("token", ["abc", "hunter2!hunter2!"])
def test_tftrun_refuses_a_weak_token_in_one_line_and_starts_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        token: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('started')\n")
    monkeypatch.setenv("TFT_JOB_TOKEN", token)
    assert tftrun.main(["--worker_num=1", f"--log_dir={tmp_path / 'logs'}", str(script)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "32 or more hex digits" in err[0] and "TFT_INSECURE_WEAK_TOKEN" in err[0]
    assert not [p for p in (tmp_path / "logs").glob("*") if p.suffix in (".log", ".jsonl")]


def test_the_token_shows_in_no_repr(tmp_path: Path) -> None:
    worker = WorkerEnv.from_env({"TFT_JOB_TOKEN": STRONG})
    config = LaunchConfig(script=tmp_path / "t.py", job_token=STRONG)
    sched = SchedulerConfig.from_env({"TFT_JOB_TOKEN": STRONG, "MS_SCHED_PORT": "1"})
    trusted = TrustedEndpoint(Endpoint("127.0.0.1", 1, 1, "r", 0.0), STRONG)
    for thing in (worker, config, sched, trusted):
        assert STRONG not in repr(thing) and STRONG not in str(thing)
