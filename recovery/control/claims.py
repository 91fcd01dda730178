"""Who saves the last-words checkpoint of a fault: the scheduler's arbitration, free of I/O.

The saving itself is :mod:`recovery.ckpt.last_words`.

When a worker dies, every survivor of its generation may hold a state consistent enough
to save (not caught in the middle of an optimizer update). One copy is enough, and two
ranks writing it would race, so each survivor *claims* the save (``Op.LAST_WORDS``) with
the generation the fault happened in (the episode), its step and whether its state is
consistent. The first consistent claim of an episode is granted; every later claim of
that episode is refused, and an inconsistent claim is never granted. The scheduler
persists the grants before it replies, so a relaunched scheduler does not grant twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Grant", "LastWords"]


@dataclass(frozen=True)
class Grant:
    """The claim that won an episode: ``rank`` saves the state of ``global_step``."""

    rank: int
    global_step: int


class LastWords:
    """The granted claims, by generation (episode)."""

    def __init__(self) -> None:
        self.grants: dict[int, Grant] = {}

    def claim(self, generation: int, rank: int, global_step: int, consistent: bool) -> bool:
        """Whether this claim may save.

        The winner asking again for the same step is answered as the first time (a
        repeated request, as for registrations), not refused.
        """
        granted = self.grants.get(generation)
        if granted is None:
            if not consistent:
                return False
            self.grants[generation] = Grant(rank, global_step)
            return True
        return consistent and granted == Grant(rank, global_step)

    def to_json(self) -> dict[str, dict[str, int]]:
        """The grants as the scheduler persists them: each grant's step under ``step``,
        the key its state files always had (mapped back in :meth:`parse`)."""
        return {str(g): {"rank": grant.rank, "step": grant.global_step}
                for g, grant in self.grants.items()}

    @staticmethod
    def parse(data: dict[str, Any]) -> dict[int, Grant]:
        """The grants of :meth:`to_json`'s output; raises on a malformed entry."""
        return {int(g): Grant(int(raw["rank"]), int(raw["step"])) for g, raw in data.items()}
