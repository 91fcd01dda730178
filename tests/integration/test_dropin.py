"""torchrun's and msrun's command lines, run for real: one node, the ports, @record's
root cause, and the environment a worker gets beside the one real torchrun gives."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from recovery import env as names
from support import BIN, run, spawn, tftrun_cmd

pytestmark = pytest.mark.timeout(180)

ALLREDUCE = str(BIN / "plain_allreduce.py")
REPO = Path(__file__).resolve().parents[2]


def _out(folder: Path) -> Path:
    out = folder / "out"
    out.mkdir(parents=True)
    return out


def test_two_standalone_jobs_in_two_folders_both_run(tmp_path: Path) -> None:
    """run.py's docstring's single-node and stacked single-node command lines, started at
    once in two folders of one host: each picks its own free port, log dir and recovery
    path (under its working folder), and both end 0."""
    lines = {
        "single": ["--standalone", "--nnodes=1", "--nproc-per-node=2"],
        "stacked": ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--nnodes=1",
                    "--nproc-per-node=2"],
    }
    procs = {}
    for name, argv in lines.items():
        folder = tmp_path / name
        procs[name] = spawn(tftrun_cmd(*argv, ALLREDUCE, "3", str(_out(folder)),
                                       cwd_recovery_path=True), cwd=folder)
    results = {name: proc.communicate(timeout=150) for name, proc in procs.items()}
    ports = set()
    for name, proc in procs.items():
        stdout, stderr = results[name]
        assert proc.returncode == 0, stdout + stderr
        ports.add(re.search(r"tftrun: master port (\d+) \(a free port", stderr).group(1))
        folder = tmp_path / name
        assert sorted(p.name for p in (folder / "out").iterdir()) == ["env_0.json", "env_1.json"]
        assert (folder / "logs" / "worker_1.log").exists()
        assert (folder / "tft_recovery").is_dir()
    assert len(ports) == 2


def test_msrun_python_train_py_runs_and_local_ranks_filter_picks_the_console(
        tmp_path: Path) -> None:
    """msrun's ``msrun ... python train.py`` (it was ``script not found: python``), with
    torchrun's ``--local_ranks_filter=1``: rank 1's output on the console, rank 0's only in
    its log file."""
    out, logs = _out(tmp_path), tmp_path / "logs"
    result = run(tftrun_cmd("--worker_num=2", "--local_worker_num=2", "--master_port=0",
                            "--local_ranks_filter=1", f"--log_dir={logs}",
                            "python", ALLREDUCE, "2", str(out)))
    assert result.returncode == 0, result.stderr
    env = json.loads((out / "env_1.json").read_text())["env"]
    assert (env[names.RANK_ID], env[names.DEVICE_ID], env[names.RANK_SIZE]) == ("1", "1", "2")
    assert "[rank 1] rank 1 done" in result.stdout
    assert "[rank 0]" not in result.stdout
    assert "rank 0 done" in (logs / "worker_0.log").read_text()


def _summary(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout[result.stdout.index("Root cause"):]


def test_record_error_file_is_the_summarys_root_cause(tmp_path: Path) -> None:
    """A rank that raises inside ``@record``: its error file is written (its folder was
    never made: the summary showed @record's FileNotFoundError) and the summary shows the
    exception and its traceback."""
    result = run(tftrun_cmd("--nproc_per_node=2", "--max_restarts=0", "--master_port=0",
                            f"--log_dir={tmp_path / 'logs'}", str(BIN / "record_boom.py"), "0"))
    assert result.returncode == 1, result.stdout + result.stderr
    summary = _summary(result)
    assert "FileNotFoundError" not in summary
    assert "  error: ValueError: boom from rank 1" in summary
    assert "traceback (from its error file):" in summary
    assert 'raise ValueError("boom from rank 1")' in summary
    error = json.loads((tmp_path / "logs" / "errors" / "worker_1.json").read_text())
    assert error["message"]["message"] == "ValueError: boom from rank 1"


def test_each_launch_starts_without_an_old_error_file(tmp_path: Path) -> None:
    """Rank 1 raises in its first launch only, then exits 3 without an error: the summary's
    root cause is that exit and its log, not the first launch's stale ValueError."""
    result = run(tftrun_cmd("--nproc_per_node=2", "--max_restarts=1", "--master_port=0",
                            f"--log_dir={tmp_path / 'logs'}", str(BIN / "record_boom.py"), "0"))
    assert result.returncode == 3, result.stdout + result.stderr
    summary = _summary(result)
    assert "exited with code 3" in summary and "error: ValueError" not in summary
    assert "last lines of its log:" in summary
    assert not (tmp_path / "logs" / "errors" / "worker_1.json").exists()


# ----------------------------------------------------------------- the environment

FIRST_CELL = re.compile(r"^\| ([^|]+) \|", re.MULTILINE)


def _listed_differences() -> set[str]:
    """The variables docs/env.md's "Beside torchrun" table lists (``MS_*``: a family)."""
    text = (REPO / "docs" / "env.md").read_text()
    section = text[text.index("## Beside torchrun"):]
    section = section[:section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
    return {name for cell in FIRST_CELL.findall(section)
            for name in re.findall(r"`([A-Z0-9_*]+)`", cell)}


def _listed(name: str, listed: set[str]) -> bool:
    return name in listed or any(entry.endswith("*") and name.startswith(entry[:-1])
                                 for entry in listed)


def test_a_workers_environment_beside_torchruns(tmp_path: Path) -> None:
    """The same command line under real torchrun and under tftrun: every variable that one
    sets and the other does not, or sets to another value, is listed in docs/env.md."""
    argv = ["--nproc_per_node=2", ALLREDUCE, "1"]
    seen = {}
    for name, command in (("torchrun", [sys.executable, "-m", "torch.distributed.run"]),
                          ("tftrun", tftrun_cmd())):
        folder = tmp_path / name
        out = _out(folder)
        result = run([*command, *argv, str(out)], cwd=folder, timeout=150)
        assert result.returncode == 0, result.stdout + result.stderr
        seen[name] = json.loads((out / "env_1.json").read_text())["env"]
    theirs, ours = seen["torchrun"], seen["tftrun"]
    differing = {name for name in theirs.keys() | ours.keys()
                 if theirs.get(name) != ours.get(name)}
    listed = _listed_differences()
    unlisted = sorted(name for name in differing if not _listed(name, listed))
    assert not unlisted, f"not in docs/env.md's 'Beside torchrun': {unlisted}"
    for name in ("GROUP_WORLD_SIZE", "ROLE_NAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "RANK",
                 "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                 "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "OMP_NUM_THREADS"):
        assert ours[name] == theirs[name], name
