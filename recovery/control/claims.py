"""Who saves the last-words checkpoint of a fault: the scheduler's arbitration, free of I/O.

One copy is enough and two writers would race, so each survivor claims the save for its episode (the
generation of the fault) and the first consistent claim wins; grants are persisted before the reply, so
a relaunched scheduler does not grant twice.
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
        """Whether this claim may save; the winner asking again for the same step is granted again (a
        repeated request), not refused."""
        if not consistent:
            return False
        return self.grants.setdefault(generation, Grant(rank, global_step)) == Grant(rank, global_step)

    def to_json(self) -> dict[str, dict[str, int]]:
        """The grants as the scheduler persists them; the step goes under ``step``, the key existing
        state files use."""
        return {str(g): {"rank": grant.rank, "step": grant.global_step}
                for g, grant in self.grants.items()}

    @staticmethod
    def parse(data: dict[str, Any]) -> dict[int, Grant]:
        """The grants of :meth:`to_json`'s output; raises on a malformed entry."""
        return {int(g): Grant(int(raw["rank"]), int(raw["step"])) for g, raw in data.items()}
