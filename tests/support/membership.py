"""Helpers for the membership rules' tests: a Membership on a fake clock, identities, and
assertions on what a registration returned."""

from __future__ import annotations

from recovery.control.members import Accepted, Identity, Refused, RefuseReason
from recovery.control.membership import Membership
from recovery.timeouts import Timeouts
from support.fake_clock import FakeClock

TOKEN = "secret"


def make(worker_num: int = 2, cooldown: float = 30.0, clock: FakeClock | None = None,
         token: str = TOKEN, progress_timeout: float = 20.0) -> Membership:
    timeouts = Timeouts(rejoin_cooldown=cooldown, cluster_time_out=60.0, heartbeat_timeout=5.0,
                        progress_timeout=progress_timeout)
    return Membership(worker_num, token, timeouts, clock or FakeClock())


def ident(node_id: str, pid: int, incarnation: int = 0, rank: int | None = None) -> Identity:
    return Identity(node_id, pid, incarnation, "host-a", rank)


def names(ms: Membership) -> list[str]:
    return [name for name, _ in ms.drain_events()]


def accepted(result: Accepted | Refused) -> Accepted:
    assert isinstance(result, Accepted), result
    return result


def refused(result: Accepted | Refused, reason: RefuseReason) -> Refused:
    assert isinstance(result, Refused), result
    assert result.reason is reason, result
    return result


def join_all(ms: Membership, pids: dict[str, int]) -> None:
    for node_id, pid in pids.items():
        accepted(ms.register(ident(node_id, pid), TOKEN))
