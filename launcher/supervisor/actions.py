"""What the restart policy decides: the actions the supervisor's loop carries out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from launcher.supervisor.failures import ExitInfo
from launcher.supervisor.state import Failure

__all__ = [
    "Action", "Hang", "ScheduleRelaunch", "Relaunch", "RestartAll", "StartAll", "Stop", "GiveUp",
    "StopWorkers", "TeardownCrash", "Kill", "Close", "RelaunchScheduler", "SchedulerSpent",
    "Retire", "ReportExit", "WaitUntil", "EXIT_PEER_ENDED",
]

EXIT_PEER_ENDED = 1
"""tftrun's status when another node ended the job (its own reason says why)."""


@dataclass(frozen=True)
class Hang:
    """SIGKILL a running rank the scheduler declared dead or hung (event ``hang``)."""

    rank: int
    reason: str


@dataclass(frozen=True)
class ScheduleRelaunch:
    """Relaunch a FAILED rank alone at ``at`` (charged now): it waits in COOLDOWN."""

    rank: int
    at: float
    why: str


@dataclass(frozen=True)
class Relaunch:
    """A rank's COOLDOWN is over: start it again."""

    rank: int


@dataclass(frozen=True)
class RestartAll:
    """Restart the whole group at ``at``; charged now unless not ``charged`` (an elastic
    job's change of nodes). A :class:`StopWorkers` comes with it."""

    at: float
    why: str
    charged: bool = True


@dataclass(frozen=True)
class StartAll:
    """The group restart is due and every worker is stopped: start them all, the retired
    ranks ``back`` among them."""

    back: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Stop:
    """End the job without a failure to blame. ``everywhere``: this node ends it for every
    node; ``close_rounds``: node 0 of an elastic job tells waiting nodes no generation comes."""

    status: int
    reason: str
    everywhere: bool = False
    close_rounds: bool = False


@dataclass(frozen=True)
class GiveUp:
    """End the job (for every node) on ``failure``: the budget is spent, or no restart
    can fix it."""

    failure: Failure
    reason: str


@dataclass(frozen=True)
class StopWorkers:
    """Send ``signum`` to each running rank of ``deadlines`` (STOPPING until its deadline,
    then SIGKILL) and withdraw every relaunch waiting in COOLDOWN."""

    signum: int
    deadlines: Mapping[int, float]


@dataclass(frozen=True)
class TeardownCrash:
    """Warn (event ``teardown_crash``) that ``rank`` crashed after the peers' final step."""

    rank: int
    failure: Failure
    step: int
    final_step: int


@dataclass(frozen=True)
class Kill:
    """A STOPPING rank's grace period is over: SIGKILL it."""

    rank: int


@dataclass(frozen=True)
class Close:
    """The job ends and no worker runs any more: stop the fork server and the scheduler."""


@dataclass(frozen=True)
class RelaunchScheduler:
    """This node's scheduler died: start it again on the same socket."""

    why: str


@dataclass(frozen=True)
class SchedulerSpent:
    """This node's scheduler died and its restart budget is spent: go on without it."""

    why: str


@dataclass(frozen=True)
class Retire:
    """Degraded training: ``rank`` leaves the job for good and the others train on without
    it; a running one gets SIGTERM and is SIGKILLed at ``deadline``."""

    rank: int
    why: str
    deadline: float = 0.0


@dataclass(frozen=True)
class ReportExit:
    """Tell the scheduler's membership of a worker's exit."""

    exit: ExitInfo


@dataclass(frozen=True)
class WaitUntil:
    """Nothing is due before ``at`` (the loop wakes earlier for any child's exit)."""

    at: float


Action = (Hang | ScheduleRelaunch | Relaunch | RestartAll | StartAll | Stop | GiveUp
          | StopWorkers | TeardownCrash | Kill | Close | RelaunchScheduler | SchedulerSpent
          | Retire | ReportExit | WaitUntil)
