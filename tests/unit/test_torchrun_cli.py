"""torchrun's and msrun's command lines reach tftrun with their meaning, or one line, exit 2.

The torchrun command lines are taken from torch's own ``torch/distributed/run.py``
docstring (the text of torchrun's documentation page), with the program name swapped; the
meaning tftrun gives each is compared with what torch's own parser makes of it.
"""

from __future__ import annotations

import re
import shlex
import signal
import sys
from dataclasses import replace
from pathlib import Path
from unittest.mock import ANY

import pytest
import torch.distributed.run as torchrun
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli import tftrun as cli
from launcher.cli.compat import console_ranks, parse_nnodes, parse_signals, strip_python
from launcher.config import DEFAULT_SIGNALS, LaunchConfig, with_node_rank
from launcher.errors import ConfigError
from launcher.procs.spec import worker_spec
from recovery import env as names
from recovery.control.node_range import DEFAULT_LAST_CALL, NodeRange

SCRIPT = "train.py"
VALUES = {"$NUM_TRAINERS": "2", "$NUM_NODES": "2", "$JOB_ID": "job7",
          "$HOST_NODE_ADDR": "node0.example.com:29400", "$PORT_k": "29401"}


def _docstring_command_lines() -> list[list[str]]:
    """Every ``torchrun ...`` block of run.py's docstring, as argv after the program name."""
    found = []
    for block in re.findall(r"::\n\n((?:[ \t]+.*\n|\n)+)", torchrun.__doc__ or ""):
        text = " ".join(line.strip() for line in block.splitlines())
        if not text.startswith("torchrun"):
            continue
        text = text.replace("(--arg1 ... train script args...)", "--arg1 x")
        text = text.replace("YOUR_TRAINING_SCRIPT.py", SCRIPT)
        for variable, value in VALUES.items():
            text = text.replace(variable, value)
        found.append(shlex.split(text)[1:])
    return found


DOCSTRING = _docstring_command_lines()
ELASTIC = [argv for argv in DOCSTRING if any(re.fullmatch(r"--nnodes=(\d+):(?!\1$)\d+", a)
                                             for a in argv)]
FIXED = [argv for argv in DOCSTRING if argv not in ELASTIC]
# torchrun's documentation pages beyond the docstring (the quickstart and the NUMA note).
DOCS = [
    ["--nnodes=2", "--nproc-per-node=2", "--rdzv-id=job7", "--rdzv-backend=c10d",
     "--rdzv-endpoint=node0.example.com:29400", SCRIPT, "--arg1", "x"],
    ["--nproc_per_node=2", SCRIPT],
    ["--standalone", "--nproc-per-node=2", SCRIPT],
    ["--nnodes=2", "--nproc_per_node=2", "--node_rank=1", "--master_addr=10.0.0.1",
     "--master_port=29500", SCRIPT],
]


def test_the_docstring_has_the_examples_this_test_expects() -> None:
    assert len(DOCSTRING) >= 5  # single-node, stacked, fault tolerant, elastic, numa
    assert len(ELASTIC) == 1


def _torch_meaning(argv: list[str]) -> tuple[int, int, str]:
    """World size, node count and rendezvous endpoint as torchrun itself reads ``argv``."""
    args = torchrun.parse_args(argv)
    if args.standalone:
        return int(args.nproc_per_node), 1, "localhost:0"
    nodes, _ = torchrun.parse_min_max_nnodes(args.nnodes)
    endpoint = args.rdzv_endpoint or f"{args.master_addr}:{args.master_port or 29500}"
    return nodes * int(args.nproc_per_node), nodes, endpoint


@pytest.mark.parametrize("argv", [a for a in FIXED + DOCS if not any("numa" in x for x in a)],
                         ids=" ".join)
def test_a_torchrun_command_line_means_the_same(argv: list[str]) -> None:
    config = cli.config_from_argv(argv)
    world, nodes, endpoint = _torch_meaning(argv)
    assert config.worker_num == world
    assert config.worker_num // config.nproc == nodes
    assert config.script == Path(SCRIPT)
    assert list(config.script_args) == argv[argv.index(SCRIPT) + 1:]
    host, port = endpoint.rsplit(":", 1)
    if "--standalone" in argv or host == "localhost" and port == "0":
        assert config.master_port == 0 and not config.multi_node  # a free port, one node
    elif "--rdzv-endpoint" in " ".join(argv) or "--master_addr" in " ".join(argv):
        assert (config.master_addr, config.master_port) == (host, int(port))
    if "--rdzv-id=job7" in argv:  # no --node_rank: node 0's scheduler would assign one
        placed = with_node_rank(config, 0)
        assert worker_spec(placed, 0, 1, 0, 1).env[names.TORCHELASTIC_RUN_ID] == "job7"


@pytest.mark.parametrize("argv", ELASTIC, ids=" ".join)
def test_an_elastic_torchrun_command_line_means_the_same(argv: list[str]) -> None:
    config = cli.config_from_argv(argv)
    args = torchrun.parse_args(argv)
    low, high = torchrun.parse_min_max_nnodes(args.nnodes)
    assert config.node_range == NodeRange(low, high)
    assert config.worker_num == high * int(args.nproc_per_node)  # ranks are < MAX x nproc
    assert config.max_restarts == args.max_restarts
    assert config.last_call == DEFAULT_LAST_CALL


@pytest.mark.parametrize("argv", [a for a in DOCSTRING if any("numa" in x for x in a)],
                         ids=" ".join)
def test_what_tftrun_cannot_do_yet_is_one_line_and_exit_2(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tftrun: error: --n"), err


def test_nproc_per_node_without_nnodes_is_one_node() -> None:
    """The first example of docs/from-torchrun.md: it was read as 4 workers of 8 (2 nodes)."""
    config = cli.config_from_argv(["--nproc_per_node=4", SCRIPT])
    assert (config.worker_num, config.nproc, config.multi_node) == (4, 4, False)


def test_no_worker_count_is_one_worker_as_torchrun() -> None:
    """It was msrun's 8; torchrun starts 1, and msrun's command lines give --worker_num."""
    config = cli.config_from_argv([SCRIPT])
    assert (config.worker_num, config.nproc, config.multi_node) == (1, 1, False)


def test_an_msrun_command_line_keeps_its_meaning() -> None:
    config = cli.config_from_argv(["--worker_num=8", SCRIPT])
    assert (config.worker_num, config.nproc, config.multi_node) == (8, 8, False)
    config = cli.config_from_argv(["--worker_num=8", "--local_worker_num=4", "--master_port=8118",
                                   SCRIPT])
    assert config.multi_node and config.nproc == 4


def test_torchrun_only_options_default_to_one_worker_on_one_node() -> None:
    for argv in (["--standalone", SCRIPT], ["-m", "pkg.train"], ["--no_python", "true"]):
        config = cli.config_from_argv(argv)
        assert (config.worker_num, config.nproc) == (1, 1), argv


def test_nproc_per_node_cpu_is_the_cores_this_process_may_use() -> None:
    import os
    assert cli.config_from_argv(["--nproc_per_node=cpu", SCRIPT]).nproc == len(
        os.sched_getaffinity(0))


def test_nproc_per_node_gpu_without_cuda_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import torch
    if torch.cuda.is_available():
        pytest.skip("this node has CUDA")
    assert cli.main(["--nproc_per_node=gpu", SCRIPT]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_entry_kinds_give_torchruns_worker_command_lines(tmp_path: Path) -> None:
    module = cli.config_from_argv(["-m", "pkg.train", "--lr", "1"])
    spec = worker_spec(module, 0, 1, 0, 1)
    assert spec.argv == (sys.executable, "-u", "-m", "pkg.train", "--lr", "1")
    exe = cli.config_from_argv(["--no_python", "/bin/echo", "hi"])
    assert worker_spec(exe, 0, 1, 0, 1).argv == ("/bin/echo", "hi")
    run_path = cli.config_from_argv(["--run_path", "--no_python", "/abs/train.py"])
    assert run_path.entry == "script"  # torchrun: --run_path takes precedence


def test_module_and_no_python_together_is_refused() -> None:
    with pytest.raises(ConfigError, match="not both"):
        cli.config_from_argv(["-m", "--no_python", "x"])


@pytest.mark.parametrize(("argv", "target", "args", "kind"), [
    (["python", "train.py", "--a"], "train.py", ("--a",), "script"),
    (["python3", "-u", "train.py"], "train.py", (), "script"),
    ([sys.executable, "train.py"], "train.py", (), "script"),
    (["python", "-m", "pkg.train", "x"], "pkg.train", ("x",), "module"),
    (["pytest", "-q", "tests"], "pytest", ("-q", "tests"), "module"),
    (["train.py", "python"], "train.py", ("python",), "script"),
])
def test_msrun_drops_a_leading_python(argv: list[str], target: str, args: tuple[str, ...],
                                      kind: str) -> None:
    entry = strip_python(Path(argv[0]), argv[1:])
    assert (entry.target, entry.args, entry.kind) == (target, args, kind)


def test_msrun_python_without_a_script_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--worker_num=1", "python"]) == 2
    assert "give the script to run after python" in capsys.readouterr().err


def test_msrun_variables_are_set_as_msrun_sets_them() -> None:
    config = cli.config_from_argv(["--worker_num=4", "--local_worker_num=2", "--node_rank=1",
                                   "--master_port=8118", "--cluster_time_out=300", SCRIPT])
    env = worker_spec(config, 1, 1, 0, 1).env
    assert (env[names.RANK_ID], env[names.DEVICE_ID], env[names.RANK_SIZE]) == ("3", "1", "4")
    assert float(env[names.MS_TOPO_TIMEOUT]) == 300


def test_torchrun_variables_are_set_as_torchrun_sets_them() -> None:
    config = cli.config_from_argv(["--nnodes=2", "--nproc_per_node=2", "--node_rank=1",
                                   "--role=trainer", "--master_addr=10.0.0.1",
                                   "--master_port=29500", SCRIPT])
    env = worker_spec(config, 0, 1, 0, 1, base_env={}).env
    assert env[names.GROUP_WORLD_SIZE] == "2"
    assert env[names.ROLE_NAME] == "trainer"
    assert env[names.TORCH_NCCL_ASYNC_ERROR_HANDLING] == "1"
    assert env[names.TORCHELASTIC_SIGNALS_TO_HANDLE] == (
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2")
    kept = worker_spec(config, 0, 1, 0, 1,
                       base_env={names.TORCH_NCCL_ASYNC_ERROR_HANDLING: "0"}).env
    assert kept[names.TORCH_NCCL_ASYNC_ERROR_HANDLING] == "0"  # the user's value wins


def test_signals_to_handle_fills_the_config_and_the_workers_variable() -> None:
    assert cli.config_from_argv([SCRIPT]).signals_to_handle == DEFAULT_SIGNALS
    config = cli.config_from_argv(["--signals_to_handle=SIGTERM,SIGUSR1", SCRIPT])
    assert config.signals_to_handle == (signal.SIGTERM, signal.SIGUSR1)
    assert worker_spec(config, 0, 1, 0, 1).env[names.TORCHELASTIC_SIGNALS_TO_HANDLE] == (
        "SIGTERM,SIGUSR1")


@pytest.mark.parametrize("text", ["SIGKILL", "TERM", "SIGNOPE", ""])
def test_a_signal_that_cannot_be_handled_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--signals_to_handle"):
        parse_signals(text)


def test_shutdown_timeout_is_grace_period() -> None:
    assert cli.config_from_argv(["--shutdown_timeout=4", SCRIPT]).grace_period == 4
    assert cli.config_from_argv([SCRIPT]).grace_period == 10


def test_rdzv_endpoint_is_node_0s_address_and_port() -> None:
    config = cli.config_from_argv(["--nnodes=2", "--nproc_per_node=1", "--node_rank=0",
                                   "--rdzv_backend=c10d", "--rdzv_endpoint=10.1.2.3", SCRIPT])
    assert (config.master_addr, config.master_port) == ("10.1.2.3", 29400)
    v6 = cli.config_from_argv(["--rdzv_endpoint=[::1]:7000", SCRIPT])
    assert (v6.master_addr, v6.master_port) == ("::1", 7000)


def test_an_etcd_backend_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--rdzv_backend=etcd-v2", SCRIPT]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--rdzv_backend=c10d" in err[0]


def test_rdzv_conf_join_timeout_is_honoured_and_others_warned_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    config = cli.config_from_argv(["--rdzv_conf=join_timeout=90,read_timeout=5,is_host=1",
                                   SCRIPT])
    assert config.cluster_time_out == 90
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tftrun: --rdzv_conf read_timeout, is_host: ignored (tftrun honours "
                   "join_timeout, last_call_timeout; see docs/from-torchrun.md)"]


def test_standalone_is_one_node_a_free_port_and_a_fresh_run_id() -> None:
    first = cli.config_from_argv(["--standalone", "--nproc_per_node=2",
                                  "--rdzv_endpoint=elsewhere:1", "--rdzv_id=x", SCRIPT])
    second = cli.config_from_argv(["--standalone", "--nproc_per_node=2", SCRIPT])
    assert (first.master_addr, first.master_port, first.multi_node) == ("127.0.0.1", 0, False)
    assert first.run_id != second.run_id and first.job_id == ""


def test_master_port_0_on_several_nodes_is_refused() -> None:
    config = cli.config_from_argv(["--nnodes=2", "--nproc_per_node=1", "--master_port=0", SCRIPT])
    with pytest.raises(ConfigError, match="free port on one node only"):
        config.validate()


def test_role_and_start_method(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.config_from_argv(["--role=trainer", SCRIPT]).role == "trainer"
    cli.config_from_argv(["--start_method=fork", SCRIPT])
    assert "--start_method=fork chooses nothing" in capsys.readouterr().err
    assert cli.main(["--start_method=thread", SCRIPT]) == 2


@pytest.mark.parametrize("option", ["--logs_specs=x", "--numa_binding=node",
                                    "--duplicate_stdout_filters=a", "--virtual_local_rank"])
def test_what_tftrun_does_not_do_is_one_line(option: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([option, SCRIPT]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-h"]) == 0
    assert "--nproc_per_node" in capsys.readouterr().out
    assert cli.main(["--version"]) == 0
    assert re.fullmatch(r"tftrun \S+\n", capsys.readouterr().out)


def test_pet_variables_are_defaults_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kubeflow's PyTorchJob passes torchrun's options as PET_* variables."""
    # The names as Kubeflow spells them, not as names.pet() makes them: the test checks both.
    for name, value in (("PET_NNODES", "2"), ("PET_NPROC_PER_NODE", "3"), ("PET_NODE_RANK", "1"),
                        ("PET_MASTER_ADDR", "10.0.0.9"), ("PET_MASTER_PORT", "23456")):
        monkeypatch.setenv(name, value)
    config = cli.config_from_argv([SCRIPT])
    assert (config.worker_num, config.nproc, config.node_rank) == (6, 3, 1)
    assert (config.master_addr, config.master_port) == ("10.0.0.9", 23456)
    assert cli.config_from_argv(["--node_rank=0", SCRIPT]).node_rank == 0


def test_redirects_tee_and_filter_choose_the_console_ranks() -> None:
    assert cli.config_from_argv([SCRIPT]).shows_output(0) is False  # tftrun's live table
    teed = cli.config_from_argv(["--nproc_per_node=3", "--tee=3", SCRIPT])
    assert teed.join and teed.console_ranks == frozenset({0, 1, 2})
    quiet = cli.config_from_argv(["--nproc_per_node=3", "--redirects=3", SCRIPT])
    assert quiet.console_ranks == frozenset() and not quiet.shows_output(0)
    one = cli.config_from_argv(["--nproc_per_node=3", "--local_ranks_filter=1", SCRIPT])
    assert [one.shows_output(rank) for rank in range(3)] == [False, True, False]


STD = st.integers(0, 3)


@settings(max_examples=100, deadline=None)
@given(nproc=st.integers(1, 6), redirect=st.dictionaries(st.integers(0, 5), STD),
       tee=st.dictionaries(st.integers(0, 5), STD),
       allowed=st.one_of(st.none(), st.sets(st.integers(0, 5), min_size=1)))
def test_console_ranks_follow_torchruns_logs_specs(nproc: int, redirect: dict[int, int],
                                                    tee: dict[int, int],
                                                    allowed: set[int] | None) -> None:
    """A rank is on the console iff torch's DefaultLogsSpecs sends one of its streams there."""
    import tempfile

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    def spell(mapping: dict[int, int]) -> str:
        return ",".join(f"{k}:{v}" for k, v in mapping.items()) or "0"

    ours = console_ranks(spell(redirect), spell(tee),
                         None if allowed is None else ",".join(map(str, sorted(allowed))), nproc)
    with tempfile.TemporaryDirectory() as root:
        specs = DefaultLogsSpecs(root, redirects=Std.from_str(spell(redirect)),
                                 tee=Std.from_str(spell(tee)), local_ranks_filter=allowed)

        dest = specs.reify({rank: {} for rank in range(nproc)})
    theirs = {rank for rank in range(nproc)
              if dest.stdouts[rank] == "" or dest.stderrs[rank] == ""
              or rank in dest.tee_stdouts or rank in dest.tee_stderrs}
    assert ours == frozenset(theirs)


@settings(max_examples=100, deadline=None)
@given(low=st.integers(-2, 64), high=st.integers(-2, 64))
def test_nnodes_reads_a_count_or_a_range(low: int, high: int) -> None:
    if 1 <= low <= high:
        assert parse_nnodes(f"{low}:{high}") == (low, high)
        assert parse_nnodes(str(low)) == (low, low)
    else:
        with pytest.raises(ConfigError, match="--nnodes"):
            parse_nnodes(f"{low}:{high}")


ELASTIC_NODE_1 = ["--nproc_per_node=2", "--node_rank=1", "--master_addr=10.0.0.1",
                  "--master_port=29500"]


def test_equal_bounds_are_the_fixed_count_and_a_range_is_elastic() -> None:
    fixed = cli.config_from_argv(["--nnodes=2", *ELASTIC_NODE_1, SCRIPT])
    assert cli.config_from_argv(["--nnodes=2:2", *ELASTIC_NODE_1, SCRIPT]) == replace(
        fixed, min_nnodes=2, run_id=ANY, job_token=ANY, epoch=ANY)
    assert fixed.node_range is None and fixed.min_nnodes == 2
    elastic = cli.config_from_argv(["--nnodes=1:3", "--rdzv_conf=last_call_timeout=4",
                                    *ELASTIC_NODE_1, SCRIPT])
    assert (elastic.node_range, elastic.worker_num, elastic.last_call) == (NodeRange(1, 3), 6, 4.0)


def test_an_elastic_range_refuses_per_rank_restarts_with_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--nnodes=1:2", "--restart_policy=rank", *ELASTIC_NODE_1, SCRIPT]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "--nnodes=1:2" in line and "--restart_policy=rank" in line


def test_the_config_defaults_are_what_the_cli_gives() -> None:
    config = cli.config_from_argv([SCRIPT])
    default = LaunchConfig(script=Path(SCRIPT))
    for name in ("master_port", "grace_period", "max_restarts", "signals_to_handle", "role",
                 "entry", "cluster_time_out"):
        assert getattr(config, name) == getattr(default, name), name
