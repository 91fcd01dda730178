"""``tftctl inject`` against a job under tftrun (tests/bin/sched_inject_worker.py, 2 ranks):
faults delivered by the scheduler at a step, by signal at once, and what the job does.

``tftctl`` runs in this process (``launcher.cli.tftctl.main``) but for one real ``tftctl status``:
a fresh process takes about 0.7 s to start (1-3 s more before it stopped importing torch),
and a fault asked for at a step must reach the rank before that step.
"""

from __future__ import annotations

import os
import subprocess
from contextlib import closing
from pathlib import Path

import pytest

from launcher.cli import tftctl as ctl
from launcher.cli.status import query
from recovery import env as names
from recovery.control.client import SchedulerControl
from support import BIN, events, run, spawn, terminate, tftctl_cmd, tftrun_cmd, wait_for, wait_for_event

pytestmark = pytest.mark.timeout(150)

SCRIPT = BIN / "sched_inject_worker.py"
MARGIN = 160
"""Steps (0.05 s each, 8 s) between the ranks' step just brought by a beat and the step a
fault is asked for: the news reaches the rank well before. With 60 (3 s) it once came 60
steps late in CI, four tests and their jobs sharing the 2 cores: the news watch, the
node's beat and the rank's look for news each wait their turn on a core."""


TOKEN = "0123456789abcdef0123456789abcdef"


def start(tmp_path: Path, port: int, option: str,
          *script_args: str) -> tuple[subprocess.Popen[str], Path]:
    """The job, its token ``TOKEN`` (as every node of a multi-node job takes it)."""
    log_dir = tmp_path / "logs"
    proc = spawn(tftrun_cmd("--worker_num=2", f"--log_dir={log_dir}", f"--master_port={port}",
                            f"--recovery_path={tmp_path / 'recovery'}", "--rejoin_cooldown=0",
                            option, str(SCRIPT), *script_args),
                 env={**os.environ, names.TFT_JOB_TOKEN: TOKEN})
    return proc, log_dir


def inject(capsys: pytest.CaptureFixture[str], log_dir: Path, *args: str) -> tuple[int, str]:
    """``tftctl inject --log_dir LOG_DIR ARGS``: its exit status and what it printed."""
    code = ctl.main(["inject", "--log_dir", str(log_dir), *args])
    out, err = capsys.readouterr()
    return code, out + err


def log(log_dir: Path, rank: int) -> str:
    path = log_dir / f"worker_{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def steps(log_dir: Path) -> dict[int, int]:
    """rank -> the step it reported last."""
    return {m["rank"]: m["step"] or 0 for m in query(log_dir)["members"]}


def step_to_inject_at(log_dir: Path) -> int:
    """``MARGIN`` steps past the ranks' step as a beat has just brought it to the scheduler.
    Between beats the scheduler's step lags the ranks' by up to a beat interval (6 s, 120
    steps, with the default timeouts), so it is read when it moves."""
    before = max(steps(log_dir).values())

    def moved() -> int:
        now = max(steps(log_dir).values())
        return now if now > before else 0

    return wait_for(moved, 30, "a beat with the ranks' step", interval=0.1) + MARGIN


def test_uce_arrives_at_its_step_one_claim_wins_and_an_exception_ends_the_job(
        tmp_path: Path, free_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    tftrun, log_dir = start(tmp_path, free_port, "--max_restarts=0", "--claim_at", "3")
    try:
        wait_for_event(log_dir, 60, "generation 0", event="generation", generation=0)
        wait_for(lambda: all("last words at step 3" in log(log_dir, r) for r in (0, 1)), 60,
                 "both ranks' last-words claims")
        answers = [log(log_dir, r).count("last words at step 3: True") for r in (0, 1)]
        assert sorted(answers) == [0, 1]
        # A stranger with another token: refused, learns nothing (checked at the end).
        with closing(SchedulerControl("127.0.0.1", free_port, "not-this-job")) as stranger:
            assert stranger._link.wait_connected(10) and stranger.status() is None
        wait_for_event(log_dir, 30, "the stranger refused", event="request_refused")
        claims = events(log_dir, "last_words_claim")
        assert sorted(c["granted"] for c in claims) == [False, True]
        assert {c["generation"] for c in claims} == {0}

        for args, error in [(("--rank", "2", "--fault", "uce"), "rank 2 is beyond worker_num=2"),
                            (("--rank", "0", "--fault", "fire"), "unknown fault 'fire'"),
                            (("--rank", "0", "--fault", "uce", "--at-step", "0"), "at_step")]:
            code, said = inject(capsys, log_dir, *args)
            assert code == 2 and said.count("\n") == 1 and said.startswith("tftctl: error: ")
            assert error in said

        at = step_to_inject_at(log_dir)
        pid = {e["rank"]: e["pid"] for e in events(log_dir, "register")}[1]
        said = inject(capsys, log_dir, "--rank", "1", "--fault", "uce", "--at_step", str(at))
        assert said == (0, f"injected uce into rank 1 (pid {pid}) at step {at}\n")
        wait_for(lambda: "caught DeviceError" in log(log_dir, 1), 60, "the uce carried out")
        [event] = events(log_dir, "inject")
        assert (event["rank"], event["fault"], event["at_step"], event["via"]) == (
            1, "uce", at, "scheduler")
        assert f"got uce (injection {event['id']}) at step {at}\n" in log(log_dir, 1)
        assert "DeviceError" not in log(log_dir, 0)

        at = step_to_inject_at(log_dir)
        assert inject(capsys, log_dir, "--rank", "1", "--fault", "exception", "--at-step",
                      str(at))[0] == 0
        out, _ = tftrun.communicate(timeout=90)
    finally:
        terminate(tftrun)
    assert tftrun.returncode == 1
    assert f"Root cause (first observed failure): rank 1 (pid {pid}) exited with code 1" \
        in out, out
    assert "recovery.control.inject.InjectedError: injected exception" in log(log_dir, 1)
    assert "got exception (injection " in log(log_dir, 1)
    assert f"at step {at}\n" in log(log_dir, 1).split("got exception")[1]
    assert [(e["rank"], e.get("exitcode")) for e in events(log_dir, "exit")
            if not e["expected"]] == [(1, 1)]
    files = [p for root in (log_dir, tmp_path / "recovery") for p in root.rglob("*")
             if p.is_file()]
    assert files and not [p for p in files if TOKEN.encode() in p.read_bytes()]


def test_kill_and_term_relaunch_the_rank_and_a_hang_is_killed_by_the_progress_verdict(
        tmp_path: Path, free_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    tftrun, log_dir = start(tmp_path, free_port, "--progress_timeout=3")
    try:
        wait_for_event(log_dir, 60, "generation 0", event="generation", generation=0)
        wait_for(lambda: min(steps(log_dir).values(), default=0) > 5, 60, "steps")
        first = {e["rank"]: e["pid"] for e in events(log_dir, "register")}

        said = inject(capsys, log_dir, "--rank", "1", "--fault", "kill")
        assert said == (0, f"injected kill into rank 1 (pid {first[1]}): SIGKILL sent\n")
        fault = wait_for_event(log_dir, 30, "the kill seen", event="fault", rank=1)
        assert (fault["pid"], fault["cause"]) == (first[1], "SIGKILL")
        [sent] = events(log_dir, "inject")
        assert (sent["via"], sent["pid"], sent["fault"]) == ("signal", first[1], "kill")
        assert sent["ts"] <= fault["ts"]
        relaunched = wait_for_event(log_dir, 60, "generation 1", event="generation",
                                    generation=1)
        second = {m["rank"]: m["pid"] for m in relaunched["members"]}
        assert second[0] == first[0] and second[1] != first[1], (
            [e for e in events(log_dir) if e["event"] in ("verdict", "exit", "fault")],
            log(log_dir, 0)[-3000:])

        shown = run(tftctl_cmd("status", "--log_dir", str(log_dir)), timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert "phase" in shown.stdout.splitlines()[2]
        assert "last fault: rank 1 cause=SIGKILL" in shown.stdout

        # term at a step goes through the scheduler; the rank sends itself SIGTERM there.
        wait_for(lambda: min(steps(log_dir).values(), default=0) > 0, 60, "steps again")
        at = step_to_inject_at(log_dir)
        assert inject(capsys, log_dir, "--rank", "0", "--fault", "term", "--at_step",
                      str(at)) == (0, f"injected term into rank 0 (pid {first[0]}) at step {at}\n")
        fault = wait_for_event(log_dir, 60, "the term seen", event="fault", rank=0)
        assert (fault["pid"], fault["cause"]) == (first[0], "SIGTERM")
        assert "got term (injection " in log(log_dir, 0)
        termed = wait_for_event(log_dir, 60, "generation 2", event="generation", generation=2)
        third = {m["rank"]: m["pid"] for m in termed["members"]}
        assert third[0] != first[0] and third[1] == second[1]

        wait_for(lambda: min(steps(log_dir).values(), default=0) > 0, 60, "steps again")
        assert inject(capsys, log_dir, "--rank", "1", "--fault", "hang")[0] == 0
        hang = wait_for_event(log_dir, 60, "the hang verdict", event="hang", rank=1)
        assert (hang["pid"], hang["reason"]) == (second[1], "progress")
        wait_for_event(log_dir, 30, "the hung rank killed", event="fault", rank=1, cause="hang")
        assert "got hang" in log(log_dir, 1)
        assert "injected hang" in log(log_dir, 1)
        assert tftrun.poll() is None  # the job goes on
    finally:
        terminate(tftrun)
