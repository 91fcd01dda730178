"""A rank slowed by ``tftctl inject --fault slow`` is named a straggler (templates/mnist,
4 ranks under tftrun) within a beat interval, and under ``evict`` replaced."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher.cli import tftctl as ctl
from launcher.cli.status import format_status, query
from support import events, spawn, terminate, wait_for, wait_for_event
from support.mnist import EVENT, NARROW, START, mnist_job, wait_job

pytestmark = pytest.mark.timeout(150)

JOB = (*NARROW, "--epochs", "1", "--max_steps", "300", "--save_steps", "100", "--synthetic_size", "40000",
       "--log_every", "50")


def start(tmp_path: Path, port: int, *options: str,
          job: tuple[str, ...] = JOB) -> tuple[subprocess.Popen[str], Path]:
    """The main job on 4 ranks; ``options`` may name ``--min_worker_num`` (else 4: no
    degraded training)."""
    cmd = mnist_job(tmp_path, "logs", port, *options, job=job)
    cmd[cmd.index("--worker_num=3")] = "--worker_num=4"
    if "--min_worker_num=3" in cmd:
        cmd[cmd.index("--min_worker_num=3")] = "--min_worker_num=4"
    return spawn(cmd), tmp_path / "logs"


def slow_down_rank_2(log_dir: Path) -> None:
    """Rank 2 3x slower once the scheduler heard every rank at step 40: past its 20
    steps of warm-up and the 20 of its first summary, its own pace and its peers'
    reference (docs/stragglers.md)."""
    wait_for_event(log_dir, START, "generation 0", event="generation", generation=0)
    wait_for(lambda: every_rank_past(log_dir, 40), START, "every rank at step 40")
    assert ctl.main(["inject", "--log_dir", str(log_dir), "--rank", "2", "--fault", "slow",
                     "--factor", "3"]) == 0


def every_rank_past(log_dir: Path, step: int) -> bool:
    members = query(log_dir)["members"]
    return len(members) == 4 and all((m["step"] or 0) >= step for m in members)


def test_a_rank_injected_slow_is_named_a_straggler_and_shown_by_status(
        tmp_path: Path, free_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    """With the defaults (a beat every 6 s): the rank's own beat tells of its slow-down
    at once, rather than the beat after the one whose summary holds more slow steps than
    fast ones, 6 to 12 s after the slow-down."""
    tftrun, log_dir = start(tmp_path, free_port)
    try:
        slow_down_rank_2(log_dir)
        assert "injected slow (3x slower) into rank 2" in capsys.readouterr().out
        [injected] = events(log_dir, "inject")
        assert (injected["fault"], injected["factor"]) == ("slow", 3.0)
        # Another rank may be named too: on two shared cores a rank's compute time can
        # stay 1.5x its peers' for a beat (of 20 steps or more) under load.
        straggler = wait_for_event(log_dir, EVENT, "rank 2 named a straggler", event="straggler",
                                   rank=2)
        assert straggler["node"] == "127.0.0.1/0"
        assert straggler["step_time"] >= 1.5 * straggler["median"] > 0
        assert straggler["since"] >= 20
        assert straggler["ts"] - injected["ts"] < 6.0, (straggler, injected)
        status = query(log_dir)
        assert 2 in [s["rank"] for s in status["stragglers"]], status["stragglers"]
        assert "straggler rank 2 (" in format_status(status)
        out = wait_job(tftrun)
    finally:
        terminate(tftrun)
    assert tftrun.returncode == 0, out
    assert len({e["params_sha256"] for e in events(log_dir, "train_end")}) == 1


def test_under_evict_the_straggler_is_killed_the_others_go_on_degraded_and_it_comes_back(
        tmp_path: Path, free_port: int) -> None:
    """``--straggler_factor=2`` and ``--max_restarts=10``: on the two shared cores at load 15
    a healthy rank's compute time stayed 1.5 to 3.8 times its peers' for a beat now and
    then, and under ``evict`` each such rank is relaunched too; one whose relaunch is named
    again at once is retired (seen at load 12: rank 0), and the job ends without it; every
    rank not retired trains to the end, with the same parameters."""
    job = (*NARROW, "--epochs", "1", "--max_steps", "450", "--save_steps", "100", "--synthetic_size",
           "80000", "--log_every", "50")
    tftrun, log_dir = start(tmp_path, free_port, "--straggler_policy=evict",
                            "--min_worker_num=2", "--max_restarts=10", "--straggler_factor=2",
                            job=job)
    try:
        slow_down_rank_2(log_dir)
        straggler = wait_for_event(log_dir, EVENT, "rank 2 named a straggler",
                                   event="straggler", rank=2)
        verdict = wait_for_event(log_dir, EVENT, "rank 2 evicted", event="verdict",
                                 verdict="straggler", rank=2)
        assert verdict["ts"] >= straggler["ts"]
        first = {e["rank"]: e["pid"] for e in events(log_dir, "spawn") if e["role"] == "worker"}
        out = wait_job(tftrun)
    finally:
        terminate(tftrun)
    assert tftrun.returncode == 0, out
    changes = events(log_dir, "membership")
    shrunk = [e for e in changes if 2 not in e["active"]]
    assert shrunk and shrunk[0]["world"] == 3, changes
    assert any(2 in e["joined"] for e in changes if e["ts"] >= verdict["ts"]), changes  # back
    retirements = [e for e in changes if e.get("retired")]
    assert all("evicted as a straggler again" in e["reason"] for e in retirements), retirements
    # Not the last generation: a healthy rank evicted in the job's last second ends it outside.
    whole = sorted({0, 1, 2, 3}.difference(*(e["retired"] for e in retirements)))
    relaunched = [e["pid"] for e in events(log_dir, "spawn") if e.get("rank") == 2]
    assert len(relaunched) >= 2 and relaunched[0] == first[2]
    ends = {e["rank"]: e["params_sha256"] for e in events(log_dir, "train_end")}
    assert sorted(ends) == whole and len(set(ends.values())) == 1, ends
