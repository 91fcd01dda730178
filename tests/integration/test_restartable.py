"""``@recovery.restartable`` on a plain DDP script (tests/bin/restartable_ddp.py), run for
real: a ``kill -9`` of one rank relaunches that rank alone, and the survivors call the
script's entry point again in their own processes, from the script's own snapshot."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from support import BIN, events, kill_rank_and_wait, log_has, spawn, spawned_pids, terminate, tftrun_cmd, wait_for

pytestmark = pytest.mark.timeout(180)

SCRIPT = str(BIN / "restartable_ddp.py")
STARTS = re.compile(r"^rank (\d+) pid (\d+) starts at step (\d+)$", re.MULTILINE)


def _starts(log_dir: Path, rank: int) -> list[tuple[int, int]]:
    """(pid, step) of each call of the script's ``main`` in rank's log, in order."""
    text = (log_dir / f"worker_{rank}.log").read_text(errors="ignore")
    return [(int(pid), int(step)) for _rank, pid, step in STARTS.findall(text)]


def test_a_killed_rank_is_relaunched_alone_and_the_survivors_call_main_again(
        tmp_path: Path) -> None:
    """4 ranks at tftrun's default ``--min_worker_num`` (the survivors' degraded generation
    is waited out), ``kill -9`` of rank 1 after its step 30 of 40 (the snapshot of step 30 is
    written by then: every 10 steps): the job ends 0, only rank 1 is spawned again,
    ranks 0, 2 and 3 each call ``main`` twice in their first process, the second time from
    the snapshot, and every rank ends with the same parameters. Rank 3 is no neighbour of
    rank 1 in gloo's ring: its collective raises only once the others drop the group."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    proc = spawn(tftrun_cmd("--nproc_per_node=4", "--rejoin_cooldown=3", f"--log_dir={logs}",
                            SCRIPT, str(out), "40", "10", degraded=True))
    try:
        wait_for(lambda: log_has(logs, 1, "step=30\n"), 120, "rank 1's step 30")
        before = kill_rank_and_wait(proc, logs, 1)
    finally:
        terminate(proc)
    assert proc.returncode == 0

    # The relaunched rank finished too (its peers first, a second after it joined), and was
    # not stopped as a rank stranded by peers that finished without it.
    assert [e["reason"] for e in events(logs, "job_end")] == ["all workers succeeded"]
    spawns = [(e["rank"], e["pid"]) for e in events(logs, "spawn") if e["role"] == "worker"]
    assert sorted(rank for rank, _pid in spawns) == [0, 1, 1, 2, 3]
    calls = [(e["rank"], e["pid"], e["call"]) for e in events(logs, "function_call")]
    assert sorted(calls) == sorted([*((r, before[r], c) for r in (0, 2, 3) for c in (1, 2)),
                                    (1, before[1], 1), (1, spawned_pids(logs)[1], 1)])
    assert not [e for e in events(logs, "restart") if e["what"] == "workers"]
    assert [e["why"] for e in events(logs, "membership")] == ["start", "shrink", "grow"]
    for survivor in (0, 2, 3):
        starts = _starts(logs, survivor)
        assert [pid for pid, _step in starts] == [before[survivor]] * 2
        assert starts[0][1] == 0 and starts[1][1] == 30
        assert log_has(logs, survivor, f"[rank {survivor}] a peer failed in generation 0")
    relaunched = _starts(logs, 1)
    assert relaunched[0] == (before[1], 0)
    assert relaunched[1][0] != before[1] and relaunched[1][1] == _starts(logs, 0)[1][1]
    finals = {json.loads((out / f"params_{rank}.json").read_text())["final"] for rank in range(4)}
    assert len(finals) == 1


def test_ranks_waiting_in_their_rendezvous_for_a_rank_that_died_are_released(
        tmp_path: Path) -> None:
    """Rank 1 of 3 is killed before its first ``init_process_group``, while ranks 0 and 2
    wait for it there (their group's timeout is torch's 30 minutes): rank 0, which hosts
    the generation's store, closes it once the scheduler reports the fault, so both raise
    within seconds, call ``main`` again with the relaunched rank 1, and the job ends 0."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    proc = spawn(tftrun_cmd("--nproc_per_node=3", "--rejoin_cooldown=3", f"--log_dir={logs}",
                            SCRIPT, str(out), "20", "10", "1", degraded=True))
    try:
        wait_for(lambda: log_has(logs, 1, "rank 1 holds before init_process_group"), 120,
                 "rank 1 holding before its rendezvous")
        before = spawned_pids(logs)
        os.kill(before[1], signal.SIGKILL)
        for survivor in (0, 2):
            wait_for(lambda s=survivor: log_has(logs, s, f"[rank {s}] a peer failed in generation 0"),
                     15, f"rank {survivor} released from its rendezvous")
        proc.communicate(timeout=120)
    finally:
        terminate(proc)
    assert proc.returncode == 0
    for survivor in (0, 2):
        assert _starts(logs, survivor) == [(before[survivor], 0)]
    finals = {json.loads((out / f"params_{rank}.json").read_text())["final"] for rank in range(3)}
    assert len(finals) == 1
