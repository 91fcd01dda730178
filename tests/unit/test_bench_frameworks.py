"""bench/frameworks_recovery.py's arithmetic on step records (step, time, pid) the test
writes: the steps redone, the time until every rank steps again, whether the survivor kept
its process."""

from __future__ import annotations

import argparse
import sys

from support import REPO

sys.path.insert(0, str(REPO / "bench"))
from frameworks_recovery import CLIENTS, DDP_STEPS_PER_EPOCH, Run, after_the_kill  # noqa: E402 - bench/ is not a package


def _records(pid: int, steps: range, start: float) -> list[tuple[int, float, int]]:
    return [(s, start + 0.1 * i, pid) for i, s in enumerate(steps)]


def test_a_restart_at_the_step_of_the_death_redoes_nothing() -> None:
    faulty = Run({0: _records(100, range(1, 16), 0.0) + _records(200, range(16, 31), 10.0),
                  1: _records(101, range(1, 16), 0.0) + _records(201, range(16, 31), 10.5)},
                 killed_at=1.55, loss=0.5)
    figures = after_the_kill(faulty)
    assert figures["steps_redone"] == 0
    assert figures["recovery_s"] == 10.5 - 1.55  # the later rank's first step again
    assert figures["survivors_kept_pids"] is False


def test_a_restart_from_the_periodic_checkpoint_redoes_the_steps_since() -> None:
    faulty = Run({0: _records(100, range(1, 17), 0.0) + _records(200, range(11, 31), 9.0),
                  1: _records(101, range(1, 16), 0.0) + _records(201, range(11, 31), 9.0)},
                 killed_at=1.6, loss=0.5)
    assert after_the_kill(faulty)["steps_redone"] == 6  # done 16, resumed at 10


def test_a_survivor_that_keeps_its_process_is_seen() -> None:
    faulty = Run({0: _records(100, range(1, 31), 0.0),
                  1: _records(101, range(1, 16), 0.0) + _records(201, range(16, 31), 2.0)},
                 killed_at=1.45, loss=0.5)
    figures = after_the_kill(faulty)
    assert figures["survivors_kept_pids"] is True
    assert figures["steps_redone"] == 0


def test_every_client_of_the_json_shape_has_its_place() -> None:
    assert list(CLIENTS) == ["ddp", "lightning", "hf"]


def test_the_ddp_tutorials_redone_steps_are_the_updates_rank_0_applied_beyond_the_jobs() -> None:
    """The DDP client counts applied updates per process (bench/ddp_clock.py): torchrun's
    restart from the epoch-0 snapshot repeats what rank 0 did past it; a survivor that kept
    its process applies each of the job's steps once."""
    args = argparse.Namespace(ddp_epochs=4)
    total = 4 * DDP_STEPS_PER_EPOCH
    restarted = Run({0: _records(100, range(1, 49), 0.0) + _records(200, range(1, total + 1), 9.0)},
                    killed_at=4.85, loss=0.5)
    kept = Run({0: _records(100, range(1, total + 1), 0.0)}, killed_at=4.85, loss=0.5)
    client = CLIENTS["ddp"]
    assert client.steps_redone(restarted, {}, args) == 48
    assert client.steps_redone(kept, {}, args) == 0
