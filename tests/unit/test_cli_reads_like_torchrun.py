"""tftrun's command line as a torchrun user reads it: the defaults, booleans as flags that
still take msrun's spellings, the help's panels, msrun's remaining options, and what the
console says of a run (no process is started)."""

from __future__ import annotations

import io
import json
import re
import socket
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli import tftctl, tftrun
from launcher.cli.flags import REFUSED
from launcher.errors import ConfigError
from launcher.procs.cores import share_of
from launcher.procs.spec import worker_spec
from launcher.view.progress import run_span
from launcher.view.render import event_line, run_line

COMMAND = typer.main.get_command(tftrun.app)
SCRIPT = "train.py"


def params(*args: str) -> dict[str, object]:
    with COMMAND.make_context("tftrun", list(args)) as ctx:
        return dict(ctx.params)


def one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """tftrun's exit status must be 2 and its stderr one line: that line."""
    assert tftrun.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# ------------------------------------------------------------------- defaults
def test_no_master_port_on_one_node_is_a_free_port() -> None:
    """It was msrun's fixed 8118: a second job on the host was refused."""
    assert tftrun.config_from_argv([SCRIPT]).master_port == 0
    assert tftrun.config_from_argv(["--nproc_per_node=4", SCRIPT]).master_port == 0
    assert tftrun.config_from_argv(["--master_port=29500", SCRIPT]).master_port == 29500


@pytest.mark.parametrize("argv", [
    ["--nnodes=2", "--nproc_per_node=2", "--node_rank=0"],
    ["--worker_num=8", "--local_worker_num=4"],
    ["--nnodes=1:2", "--nproc_per_node=1", "--master_addr=10.0.0.1"],
], ids=" ".join)
def test_several_nodes_without_a_master_port_is_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    line = one_error_line(capsys, [*argv, SCRIPT])
    assert line.startswith("tftrun: error: a job of several nodes needs --master_port"), line


def test_progress_lines_come_every_10_s_off_a_terminal() -> None:
    assert tftrun.config_from_argv([SCRIPT]).progress_interval == 10.0


# ------------------------------------------------------------------- booleans
VALUED = ["join", "is_recover", "fork_server", "bind_core"]
"""msrun's booleans: --opt, --opt=V and --opt V."""
TRUE, FALSE = ["1", "true", "True", "TRUE", "yes", "on"], ["0", "false", "False", "no", "off"]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(VALUED), word=st.sampled_from(TRUE + FALSE),
       dashes=st.booleans(), joined=st.booleans())
def test_msrun_booleans_keep_their_spellings(name: str, word: str, dashes: bool,
                                             joined: bool) -> None:
    option = "--" + (name.replace("_", "-") if dashes else name)
    args = [f"{option}={word}"] if joined else [option, word]
    got = params(*args, SCRIPT, "--epochs", "3")
    assert got[name] is (word in TRUE)
    assert got["script"] == Path(SCRIPT) and got["script_args"] == ["--epochs", "3"]


@pytest.mark.parametrize(("args", "name", "value"), [
    (["--join"], "join", True), (["--bind_core"], "bind_core", True),
    (["--is-recover"], "is_recover", True), ([], "fork_server", True),
    (["--no_fork_server"], "fork_server", False), (["--no-fork-server"], "fork_server", False),
    (["--standalone"], "standalone", True), (["--standalone=1"], "standalone", True),
    (["--standalone=0"], "standalone", False), (["-m"], "module", True),
])
def test_booleans_are_flags(args: list[str], name: str, value: bool) -> None:
    assert params(*args, SCRIPT)[name] is value


def test_a_flag_before_the_script_leaves_a_word_that_is_no_boolean_to_be_the_script() -> None:
    got = params("--join", "train.py", "--join=0", "1")
    assert got["join"] is True
    assert got["script"] == Path("train.py") and got["script_args"] == ["--join=0", "1"]


def test_a_bad_boolean_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert one_error_line(capsys, ["--join=maybe", SCRIPT]) == (
        "tftrun: error: --join takes True or False, got 'maybe'")


def test_every_option_takes_both_spellings_and_both_forms() -> None:
    assert params("--rejoin-cooldown", "5", "--log-dir=x", SCRIPT)["rejoin_cooldown"] == 5.0
    assert params("--rejoin_cooldown=5", SCRIPT)["rejoin_cooldown"] == 5.0


# -------------------------------------------------------------------- refused
@pytest.mark.parametrize(("option", "why"), [
    ("--sim_level=1", "MindSpore's dry run, a simulation of Ascend devices"),
    ("--sim-rank-id=3", "Ascend dry run"),
    ("--rank_table_file=/etc/hccl.json", "Ascend devices' rank table"),
    ("--bind_numa=True", "--bind_core"),
])
def test_msruns_ascend_options_are_refused_with_why(capsys: pytest.CaptureFixture[str],
                                                     option: str, why: str) -> None:
    line = one_error_line(capsys, [option, SCRIPT])
    assert line.startswith("tftrun: error: --") and why in line, line


# ----------------------------------------------------------------------- help
def help_text(argv: list[str], app: typer.Typer = tftrun.app, prog: str = "tftrun") -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        code = (tftrun.main if app is tftrun.app else tftctl.main)(argv)
    assert code == 0
    return out.getvalue()


def test_help_has_an_example_panels_and_the_refused_options_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = help_text(["-h"])
    assert text == help_text(["--help"])
    lines = text.splitlines()
    example = next(i for i, line in enumerate(lines) if "tftrun --nproc_per_node=4 train.py" in line)
    panels = [line.split("─ ")[1].split(" ─")[0] for line in lines if line.startswith("╭─ ")]
    assert panels == ["Arguments", "Options", "Launch", "Recovery", "Multi-node", "Logging",
                      "torchrun/msrun compatibility"]
    assert example < next(i for i, line in enumerate(lines) if line.startswith("╭─ "))
    refused = [line for line in lines if "Refused" in line]
    assert len(refused) == 1 and lines.index(refused[0]) > max(
        i for i, line in enumerate(lines) if line.startswith("╰"))
    tail = " ".join(lines[lines.index(refused[0]):])
    for name in REFUSED:
        assert f"--{name}" in tail
        assert not any(line.startswith(f"│ --{name} ") for line in lines), name
    assert "…" not in text  # nothing cut short at 80 columns
    for name in ("--join", "--is_recover", "--fork_server", "--bind_core", "--standalone"):
        row = next(line for line in lines if line.startswith(f"│ {name} "))
        assert "<str>" not in row and "<bool>" not in row, row


def test_help_wraps_no_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every word of the help at 80 columns is a word of the help at 200: none is cut in two
    (a default read 'SIGI NT')."""
    def words(columns: int) -> set[str]:
        monkeypatch.setenv("COLUMNS", str(columns))
        return set(re.split(r"[\s│╭╮╰╯─]+", help_text(["--help"])))

    narrow = words(80)
    assert "SIGINT," in narrow and narrow <= words(200), narrow - words(200)


def test_tftctl_has_h_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "Usage: tftctl" in help_text(["-h"], tftctl.app, "tftctl")
    assert help_text(["--version"], tftctl.app, "tftctl").startswith("tftctl ")
    assert help_text(["--version"]).startswith("tftrun ")


# ------------------------------------------------------ msrun's log options
def test_tail_worker_log_picks_the_ranks_join_streams() -> None:
    config = tftrun.config_from_argv(["--nproc_per_node=4", "--tail_worker_log=1", SCRIPT])
    assert config.join and config.console_ranks == frozenset({1})
    assert tftrun.config_from_argv(["--nproc_per_node=4", "--tail_worker_log=0,3",
                                    SCRIPT]).console_ranks == frozenset({0, 3})
    everyone = tftrun.config_from_argv(["--nproc_per_node=4", "--tail_worker_log=-1", SCRIPT])
    assert everyone.join and everyone.console_ranks is None


@pytest.mark.parametrize("value", ["4", "x", "0,9", ""])
def test_tail_worker_log_outside_the_node_is_one_line(capsys: pytest.CaptureFixture[str],
                                                      value: str) -> None:
    line = one_error_line(capsys, ["--nproc_per_node=4", f"--tail_worker_log={value}", SCRIPT])
    assert line.startswith(f"tftrun: error: --tail_worker_log={value}: give this node's local ranks"), line


def test_worker_log_name_names_each_workers_log_as_msrun_does(tmp_path: Path) -> None:
    config = tftrun.config_from_argv(["--nproc_per_node=2", f"--log_dir={tmp_path}",
                                      "--worker_log_name=w_{ip}_{hostname}_test", SCRIPT])
    expected = tmp_path / f"w_127.0.0.1_{socket.gethostname()}_test_1.log"
    assert config.worker_log(1) == expected
    assert worker_spec(config, 1, 0, 0, 1).log_path == expected
    assert expected.match(config.worker_log_glob)
    default = tftrun.config_from_argv([f"--log_dir={tmp_path}", SCRIPT])
    assert default.worker_log(0) == tmp_path / "worker_0.log"


@pytest.mark.parametrize(("name", "message"), [
    ("w_{rank}", "braces may name only {ip}, {hostname}"),
    ("w_{", "braces may name only"),
    ("logs/w", "give a file name"),
])
def test_a_bad_worker_log_name_is_refused(tmp_path: Path, name: str, message: str) -> None:
    (tmp_path / SCRIPT).write_text("")
    config = tftrun.config_from_argv([f"--log_dir={tmp_path}", f"--worker_log_name={name}",
                                      str(tmp_path / SCRIPT)])
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        config.validate()


@settings(max_examples=200, deadline=None)
@given(cores=st.lists(st.integers(0, 255), min_size=1, max_size=64, unique=True).map(sorted),
       nproc=st.integers(1, 80))
def test_bind_core_shares_the_cores_fairly(cores: list[int], nproc: int) -> None:
    shares = [share_of(cores, nproc, rank) for rank in range(nproc)]
    assert all(share and share <= set(cores) for share in shares)
    if nproc <= len(cores):  # consecutive blocks in rank order, covering every core once
        assert [c for share in shares for c in sorted(share)] == cores
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    else:  # one core each, every core used as evenly as the count allows
        counts = [sum(core in share for share in shares) for core in cores]
        assert all(len(share) == 1 for share in shares) and max(counts) - min(counts) <= 1


def test_bind_core_blocks_are_consecutive_by_local_rank() -> None:
    assert [sorted(share_of(range(8), 3, r)) for r in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [sorted(share_of([0, 1], 2, r)) for r in range(2)] == [[0], [1]]


# ------------------------------------------------------------ what is printed
def test_a_clean_exit_reads_as_one() -> None:
    base = {"ts": 0.0, "event": "exit", "role": "worker", "rank": 0, "pid": 42, "incarnation": 0}
    clean = event_line({**base, "expected": False, "outcome": "clean", "exitcode": 0})
    assert clean == "exit role=worker rank=0 pid=42 incarnation=0 exitcode=0: a clean exit"
    killed = event_line({**base, "expected": False, "outcome": "failed", "signal": "SIGKILL"})
    assert killed.endswith("signal=SIGKILL: a failure")
    stopped = event_line({**base, "expected": True, "outcome": "stopped", "signal": "SIGTERM"})
    assert stopped.endswith("signal=SIGTERM: stopped by tftrun")


def test_the_summary_line_has_wall_time_final_step_speed_and_logs(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    records = [{"ts": 100.0, "event": "job_start"},
               *({"ts": 102.0 + i, "event": "step", "rank": 0, "step": 10 * i, "total": 40}
                 for i in range(4)),
               {"ts": 105.5, "event": "train_end", "rank": 0, "step": 40}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert run_line(run_span(path), 112.25, "/x/logs") == (
        "wall time 12.2 s, final step 40 of 40, 11.4 steps/s; logs in /x/logs")
    assert run_line(run_span(tmp_path / "none.jsonl"), 5.0, "/x/logs") == "logs in /x/logs"
