"""The fault schedule of the chaos test (tests/integration/test_chaos.py): which faults,
against which ranks, at which steps, all drawn from one seed so that a failing run can be
replayed exactly with ``TFT_CHAOS_SEED=<seed>``; and, from the same seed, its degraded
trials (training through a fault, docs/elastic.md)."""

from __future__ import annotations

import os
import random
import secrets
from dataclasses import dataclass

SEED_VARIABLE = "TFT_CHAOS_SEED"
"""Set it to replay the schedule of a run (its seed is printed by every trial)."""

KILL_ONE = "kill_one"
KILL_TWO = "kill_two"
KILL_SCHEDULER = "kill_scheduler"
KILL_WHILE_REJOINING = "kill_while_rejoining"
SIGSTOP = "sigstop"

VICTIMS = {KILL_ONE: 1, KILL_TWO: 2, KILL_SCHEDULER: 0, KILL_WHILE_REJOINING: 2, SIGSTOP: 1}
"""How many workers each kind of fault strikes (the scheduler kill strikes none)."""
FAULTS = {KILL_ONE: 1, KILL_TWO: 2, KILL_SCHEDULER: 1, KILL_WHILE_REJOINING: 2, SIGSTOP: 1}
"""How many faults (kill -9 or SIGSTOP of one process) a trial of each kind injects."""

MOMENTS = ("spawn", "register")
"""When the second rank of ``kill_while_rejoining`` dies: once the first one's replacement
is started (still importing torch), or once it has registered for the next generation."""
MODES = ("{TTP:1,UCE:1,ARF:1}", "{TTP:0,UCE:0,ARF:0}")
"""``--enable_tft`` of a trial: lose nothing (replica, last words), or rollback only."""


class Strikes:
    """A trial's struck worker ranks (``victims``) and the others, which must keep their
    first process."""

    victims: tuple[int, ...]

    def survivors(self, workers: int) -> list[int]:
        return [rank for rank in range(workers) if rank not in self.victims]


@dataclass(frozen=True)
class Trial(Strikes):
    """One run of the main job with one kind of fault.

    ``victims`` are the worker ranks struck, in order (for ``kill_while_rejoining``, the
    first dies at ``step``, the second while the first one's replacement rejoins); every
    other rank is a survivor and must keep its process.
    """

    index: int
    kind: str
    step: int
    victims: tuple[int, ...]
    moment: str | None
    modes: str

    def __str__(self) -> str:
        victims = "".join(f"r{rank}" for rank in self.victims) or "sched"
        moment = f"-at_{self.moment}" if self.moment else ""
        lose_nothing = "tft_on" if self.modes == MODES[0] else "tft_off"
        return f"{self.index}-{self.kind}-{victims}-step{self.step}{moment}-{lose_nothing}"


def chaos_seed() -> int:
    """``TFT_CHAOS_SEED`` if set (a replay), else a new seed: each run of the suite covers
    a schedule of its own, and prints its seed so that a failure can be replayed."""
    text = os.environ.get(SEED_VARIABLE, "").strip()
    return int(text) if text else secrets.randbelow(2**31)


def chaos_schedule(seed: int, workers: int, steps: range) -> list[Trial]:
    """One trial of every kind, in an order, at steps and against ranks drawn from ``seed``.

    Every kind appears once, so a run injects ``sum(FAULTS.values())`` faults (7) whatever
    the seed; ``steps`` are the steps a fault may be injected at (each must be logged).
    """
    rng = random.Random(seed)
    kinds = list(VICTIMS)
    rng.shuffle(kinds)
    return [
        Trial(index=index, kind=kind, step=rng.choice(steps),
              victims=tuple(rng.sample(range(workers), VICTIMS[kind])),
              moment=rng.choice(MOMENTS) if kind == KILL_WHILE_REJOINING else None,
              modes=rng.choice(MODES))
        for index, kind in enumerate(kinds)
    ]


POLICIES = ("constant", "shrink")
"""``--batch_policy`` of the degraded trials: one trial each."""


@dataclass(frozen=True)
class DegradedTrial(Strikes):
    """One run of the degraded job (tests/support/degraded.py) under ``--min_worker_num=
    min_workers``: the ``victims`` are ``kill -9``ed together at ``step``, at least
    ``min_workers`` ranks are left, and they train on under ``policy`` until the victims'
    relaunches heal."""

    index: int
    policy: str
    step: int
    victims: tuple[int, ...]
    min_workers: int

    def __str__(self) -> str:
        victims = "".join(f"r{rank}" for rank in self.victims)
        return (f"degraded{self.index}-{self.policy}-kill_{victims}-step{self.step}"
                f"-min{self.min_workers}")


def degraded_schedule(seed: int, workers: int, steps: range) -> list[DegradedTrial]:
    """One trial per batch policy; one kills one rank, the other two at once (which one
    does which is drawn), each at a drawn step, against drawn ranks, with a drawn
    ``--min_worker_num`` that the survivors still meet.

    Drawn from a generator of its own (seeded from ``seed``), so that the main schedule of
    a seed stays what it was.
    """
    rng = random.Random(f"{seed}-degraded")
    counts = [1, 2]
    rng.shuffle(counts)
    return [
        DegradedTrial(index=index, policy=policy, step=rng.choice(steps),
                      victims=tuple(sorted(rng.sample(range(workers), count))),
                      min_workers=rng.randint(1, workers - count))
        for index, (policy, count) in enumerate(zip(POLICIES, counts))
    ]


CHAOS_SEED = chaos_seed()
"""This run's seed, drawn once per pytest process (printed in the report header)."""
