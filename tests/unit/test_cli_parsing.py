"""tftrun's option parsing: msrun's and torchrun's spellings reach the same LaunchConfig."""

from __future__ import annotations

import io
from contextlib import redirect_stderr
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli import tftrun as cli
from launcher.errors import ConfigError
from launcher.procs.spec import worker_spec
from recovery import env as names

COMMAND = typer.main.get_command(cli.app)


def parse(*args: str) -> dict[str, object]:
    with COMMAND.make_context("tftrun", list(args)) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("args", [
    ["--worker_num=4", "--local_worker_num", "2", "--log_dir=x", "train.py"],
    ["--worker-num", "4", "--local-worker-num=2", "--log-dir", "x", "train.py"],
])
def test_both_spellings_and_both_forms(args: list[str]) -> None:
    params = parse(*args)
    assert params["worker_num"] == 4
    assert params["local_worker_num"] == 2
    assert params["log_dir"] == Path("x")


def test_everything_after_the_script_belongs_to_the_script() -> None:
    params = parse("--worker_num=2", "train.py", "--worker_num=9", "--epochs", "3")
    assert params["worker_num"] == 2
    assert params["script"] == Path("train.py")
    assert params["script_args"] == ["--worker_num=9", "--epochs", "3"]


def test_defaults() -> None:
    params = parse("train.py")
    assert params["worker_num"] is None  # resolved to nnodes x nproc_per_node by launch()
    assert params["master_addr"] is None  # 127.0.0.1 unless Slurm or Kubernetes says
    assert params["node_rank"] is None  # Slurm or Kubernetes, else automatic
    assert params["master_port"] is None  # a free port on one node
    assert params["cluster_time_out"] is None  # 600 unless --rdzv_conf=join_timeout=N
    assert cli.config_from_argv(["train.py"]).cluster_time_out == 600.0
    assert params["rejoin_cooldown"] == 30.0
    assert params["join"] is False


@pytest.mark.parametrize(("text", "expected"), [
    ("True", True), ("true", True), ("1", True), ("False", False), ("0", False), ("no", False),
])
def test_msrun_boolean_spelling(text: str, expected: bool) -> None:
    assert cli.parse_bool(text, "--join") is expected


def test_bad_boolean_is_a_usage_error() -> None:
    with pytest.raises(ConfigError, match="--join takes True or False"):
        cli.parse_bool("maybe", "--join")


def test_unknown_option_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--no_such_option=1", "train.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--no_such_option" in err[0]


@pytest.mark.parametrize("args", [["--warm_spare=0"], ["--warm-spare", "2"]])
def test_warm_spare_is_accepted_with_one_line_saying_it_does_nothing(
        args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Deprecated: every worker and relaunch is forked warm by the fork server; a command
    line that gives it still runs, as the same job as without it."""
    given, plain = cli.config_from_argv([*args, "train.py"]), cli.config_from_argv(["train.py"])
    fresh = {"run_id": plain.run_id, "job_token": plain.job_token, "epoch": plain.epoch}
    assert replace(given, **fresh) == plain  # each launch draws its own run id and token
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tftrun: --warm_spare is deprecated and has no effect: the fork server (on by "
                   "default) starts every worker and relaunch warm"]


FLOAT_OPTIONS = ["cluster_time_out", "rejoin_cooldown", "rejoin_timeout", "monitor_interval", "heartbeat_timeout",
                 "progress_timeout", "grace_period", "shutdown_timeout"]
TORCHRUN_FLOAT_OPTIONS = {"monitor_interval", "shutdown_timeout"}
"""torchrun's options: their default may come from PET_<OPTION>, and the error says so."""
NOT_FINITE = st.builds(
    lambda sign, word, upper: sign + (word.upper() if upper else word),
    st.sampled_from(["", "+", "-"]), st.sampled_from(["nan", "inf", "infinity", "1e999", "9e400"]),
    st.booleans())


@settings(max_examples=40, deadline=None)
@given(option=st.sampled_from(FLOAT_OPTIONS), value=NOT_FINITE)
def test_a_float_option_refuses_nan_and_the_infinities(option: str, value: str) -> None:
    with redirect_stderr(io.StringIO()) as err:
        assert cli.main([f"--{option}={value}", "train.py"]) == 2
    pet = f" (env var: 'PET_{option.upper()}')" if option in TORCHRUN_FLOAT_OPTIONS else ""
    assert err.getvalue().splitlines() == [
        f"tftrun: error: Invalid value for '--{option}'{pet}: "
        f"{value!r} is not a finite number (see 'tftrun --help')"]


@settings(max_examples=40, deadline=None)
@given(option=st.sampled_from(FLOAT_OPTIONS),
       value=st.floats(allow_nan=False, allow_infinity=False))
def test_a_float_option_takes_every_finite_float(option: str, value: float) -> None:
    assert parse(f"--{option}={value!r}", "train.py")[option] == value


def test_batch_policy_defaults_to_constant_and_reaches_the_workers() -> None:
    assert cli.config_from_argv(["train.py"]).batch_policy == "constant"
    config = cli.config_from_argv(["--batch-policy", "shrink", "--worker_num=2", "train.py"])
    assert config.batch_policy == "shrink"
    assert worker_spec(config, 0, 1, 0, 1).env[names.TFT_BATCH_POLICY] == "shrink"
    default = cli.config_from_argv(["--worker_num=2", "train.py"])
    assert worker_spec(default, 1, 1, 0, 1).env[names.TFT_BATCH_POLICY] == "constant"


def test_an_unknown_batch_policy_is_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    assert cli.main(["--batch_policy=grow", f"--log_dir={tmp_path}", str(script)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tftrun: error: --batch_policy must be one of constant, shrink, got 'grow'"]


@pytest.mark.parametrize(("args", "fewest"), [
    (["--worker_num=4"], "1"),  # degraded training on: any survivor trains on
    (["--worker_num=4", "--min_worker_num=4"], "4"),  # off: the bitwise guarantee
    (["--worker_num=4", "--min-worker-num", "3"], "3"),
    (["--worker_num=1"], "1"),
    (["--nnodes=1:2", "--nproc_per_node=2", "--node_rank=0", "--master_port=29500"], "4"),
])
def test_min_worker_num_defaults_to_one_and_reaches_the_workers_and_the_scheduler(
        args: list[str], fewest: str) -> None:
    config = cli.config_from_argv([*args, "train.py"])
    assert str(config.min_worker_num) == fewest
    assert worker_spec(config, 0, 0, 0, 1).env[names.TFT_MIN_WORKER_NUM] == fewest


def test_rejoin_timeout_defaults_to_the_cooldown_plus_torchruns_last_call() -> None:
    assert cli.config_from_argv(["train.py"]).rejoin_timeout == 30.0 + 30.0
    assert cli.config_from_argv(["--rejoin_cooldown=5", "train.py"]).rejoin_timeout == 35.0
    assert cli.config_from_argv(["--rejoin-timeout", "8", "train.py"]).rejoin_timeout == 8.0


def test_a_rejoin_timeout_not_positive_is_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["--rejoin_timeout=0", f"--log_dir={tmp_path}", "train.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tftrun: error: --rejoin_timeout must be positive, got 0.0"]
