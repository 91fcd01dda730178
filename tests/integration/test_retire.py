"""Retire for good (docs/elastic.md): under tftrun with ``--min_worker_num=2`` of 3, rank 1
is killed and none of its relaunches comes back (each exits 1 at once, until
``--max_restarts`` is spent). ``--rejoin_timeout`` after the kill it is retired: a
``membership`` event with ``why: shrink`` and ``retired: [1]``, no relaunch after it; the
two others train to the end with the same global batch, and the job exits 0. With ranks 1
and 2 both gone, one rank is fewer than 2: none is retired, and the job ends at
``--node_time_out`` with one reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support import BIN, REPO, events, free_tcp_port, run_gated_with_kills, tftrun_cmd, wait_for_event
from support.mnist import NARROW

pytestmark = pytest.mark.timeout(240)

TRAIN = str(REPO / "templates" / "mnist" / "train.py")
WORKERS, BATCH, SAMPLES, EPOCHS, KILL_STEP, KILLED = 3, 32, 12000, 2, 20, 1
"""2 epochs, each step held 0.2 s (tests/bin/paced.py) until the test saw the retirement:
the survivors train past it however fast the machine is."""
REJOIN_TIMEOUT, MAX_RESTARTS, NODE_TIME_OUT = 6, 2, 8
STEPS = EPOCHS * (SAMPLES // WORKERS // BATCH)


def run_with_kills(tmp_path: Path, killed: list[int], node_time_out: int,
                   cooldown: int = 1) -> tuple[int, str]:
    """The job with ``killed`` ranks killed at step 20 and never back, paced until a
    retirement; its status, output."""
    log_dir, gate, release = tmp_path / "logs", tmp_path / "gate", tmp_path / "release"
    command = tftrun_cmd(
        f"--worker_num={WORKERS}", "--min_worker_num=2", f"--log_dir={log_dir}",
        f"--recovery_path={tmp_path / 'recovery'}", f"--master_port={free_tcp_port()}",
        f"--rejoin_cooldown={cooldown}", f"--rejoin_timeout={REJOIN_TIMEOUT}",
        f"--max_restarts={MAX_RESTARTS}", "--cluster_time_out=120",
        f"--node_time_out={node_time_out}", str(BIN / "no_return.py"), ",".join(map(str, killed)),
        str(BIN / "gated.py"), str(gate), str(BIN / "paced.py"), str(release), TRAIN, *NARROW,
        "--epochs", str(EPOCHS), "--save_steps", "1000", "--synthetic_size", str(SAMPLES),
        "--batch_size", str(BATCH), "--log_every", "100")

    def release_once_retired() -> None:
        if len(killed) < WORKERS - 1:  # the survivors meet --min_worker_num=2
            wait_for_event(log_dir, 120, "the retirement", event="membership", retired=killed)
            release.touch()

    return run_gated_with_kills(command, log_dir, gate, killed, KILL_STEP, timeout=220,
                                then=release_once_retired)


def test_a_rank_that_cannot_come_back_is_retired_and_the_others_finish(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    status, output = run_with_kills(tmp_path, [KILLED], node_time_out=120)
    assert status == 0, output

    changes = [(e["why"], e["active"], e.get("retired", [])) for e in events(log_dir, "membership")]
    assert changes == [("start", [0, 1, 2], []), ("shrink", [0, 2], []),
                       ("shrink", [0, 2], [KILLED])], changes
    [retire] = [e for e in events(log_dir, "membership") if e.get("retired")]
    assert retire["world"] == 2 and f"--rejoin_timeout={REJOIN_TIMEOUT}s" in retire["reason"]
    # Timed from the exit the supervisor saw; the fault event is written just after it.
    [fault] = [e for e in events(log_dir, "fault") if e.get("rank") == KILLED][:1]
    assert REJOIN_TIMEOUT - 0.5 <= retire["ts"] - fault["ts"] < REJOIN_TIMEOUT + 5
    relaunches = [e for e in events(log_dir, "restart") if e.get("what") == "rank"]
    # Relaunched within the budget, never after the retirement: how many relaunches fit
    # in the rejoin timeout depends on the load (one, not two, was seen in CI).
    assert 1 <= len(relaunches) <= MAX_RESTARTS
    assert all(e["ts"] < retire["ts"] for e in relaunches)

    ends = {e["rank"]: e for e in events(log_dir, "train_end")}
    assert set(ends) == {0, 2} and {e["step"] for e in ends.values()} == {STEPS}
    assert ends[0]["params_sha256"] == ends[2]["params_sha256"]
    [job_end] = events(log_dir, "job_end")
    assert job_end["exitcode"] == 0 and "ranks [1] were retired" in job_end["reason"]


def test_below_min_worker_num_none_is_retired_and_the_job_ends_at_node_time_out(
        tmp_path: Path) -> None:
    """Ranks 1 and 2 killed; their relaunches wait out a cooldown longer than
    ``--node_time_out``: they could come back, so the job waits that long, then ends.
    (With the budget spent instead, none could: the job ends at once, tests/unit.)"""
    log_dir = tmp_path / "logs"
    status, output = run_with_kills(tmp_path, [1, 2], node_time_out=NODE_TIME_OUT,
                                    cooldown=NODE_TIME_OUT + 30)
    assert status != 0, output  # the status of the first rank gone's last failure
    assert not [e for e in events(log_dir, "membership") if e.get("retired")]
    [job_end] = events(log_dir, "job_end")
    assert job_end["reason"] == (f"1 of 3 ranks train, fewer than --min_worker_num=2, and ranks "
                                 f"[1, 2] were not back within --node_time_out={NODE_TIME_OUT}s")
    second = max(e["ts"] for e in events(log_dir, "fault") if e["cause"] == "SIGKILL")
    assert NODE_TIME_OUT - 0.5 <= job_end["ts"] - second < NODE_TIME_OUT + 15
    assert not events(log_dir, "train_end")
