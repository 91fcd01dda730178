"""Opt-in: tftrun under a real ``srun`` takes its node rank, node count and master from Slurm.

Needs a running Slurm: tests/slurm/start-local-slurm.sh starts one on this host (see
docs/multi-node.md#a-one-host-slurm-for-the-test) and prints the ``SLURM_CONF`` to export.
Skipped, at no cost, when ``srun`` is absent or no controller answers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from launcher.nodes.cluster_env import expand_hostlist
from recovery import env as names
from support import BIN, free_tcp_port, run, tftrun_cmd

pytestmark = pytest.mark.timeout(180)

SRUN = ["srun", "--nodes=1", "--ntasks=1", "--kill-on-bad-exit=1", "--time=3", "--quiet"]


@pytest.fixture(scope="module")
def slurm() -> None:
    """Skip unless ``srun`` exists and a controller answers ``scontrol ping``."""
    if shutil.which("srun") is None or shutil.which("scontrol") is None:
        pytest.skip("no srun here (apt-get install slurm-wlm; tests/slurm/start-local-slurm.sh)")
    conf = os.environ.get("SLURM_CONF")
    if conf is not None and not Path(conf).is_file():
        pytest.skip(f"SLURM_CONF={conf} is not a file")  # scontrol would retry for 60 s
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        pytest.skip("scontrol ping did not answer within 15 s")
    if ping.returncode != 0 or "UP" not in ping.stdout:
        pytest.skip("no Slurm controller answers (tests/slurm/start-local-slurm.sh starts one)")


def _srun_tftrun(tmp_path: Path, name: str, *flags: str) -> dict[str, str]:
    """``srun tftrun --nproc_per_node=2 ... plain_allreduce.py``; rank 0's env, once it passed."""
    log_dir, out = tmp_path / name, tmp_path / f"{name}_out"
    out.mkdir()
    cmd = [*SRUN, *tftrun_cmd(
        "--nproc_per_node=2", f"--log_dir={log_dir}", f"--recovery_path={tmp_path / 'rp'}",
        f"--master_port={free_tcp_port()}", "--grace_period=5", *flags,
        str(BIN / "plain_allreduce.py"), "3", str(out))]
    result = run(cmd, timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads((out / "env_0.json").read_text())
    other = json.loads((out / "env_1.json").read_text())
    assert seen["world_size"] == 2 and other["value"] == seen["value"]
    return {**seen["env"], "tftrun_stderr": result.stderr}


@pytest.mark.usefixtures("slurm")
def test_srun_tells_tftrun_its_node_rank_node_count_and_master(tmp_path: Path) -> None:
    env = _srun_tftrun(tmp_path, "from_slurm")
    master = next(expand_hostlist(env[names.SLURM_STEP_NODELIST]))
    assert (env[names.SLURM_PROCID], env[names.SLURM_NTASKS]) == ("0", "1")
    assert f"tftrun: from Slurm: node_rank=0 nnodes=1 master_addr={master}" in env["tftrun_stderr"]
    # nnodes=1 from Slurm made worker_num 1 x 2; the workers meet at the master Slurm named.
    assert (env[names.GROUP_RANK], env[names.WORLD_SIZE]) == ("0", "2")
    assert (env[names.MASTER_ADDR], env[names.MS_SCHED_HOST]) == (master, master)


@pytest.mark.usefixtures("slurm")
def test_under_srun_a_given_flag_still_wins(tmp_path: Path) -> None:
    env = _srun_tftrun(tmp_path, "flags_win", "--master_addr=127.0.0.1", "--node_rank=0")
    assert "tftrun: from Slurm: nnodes=1\n" in env["tftrun_stderr"]
    assert env[names.MASTER_ADDR] == "127.0.0.1"
