"""The record the timed bench job writes and the bench reads: one file of completed steps per rank.

``<dir>/steps_<rank>.txt`` holds one line ``rank global_step unix_time pid`` per completed
step, appended in order; ``<dir>/fault`` holds the unix time of the one fault, and
``<dir>/final_loss`` rank 0's final model's loss over the first samples (a float).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FAULT_FILE = "fault"
FINAL_LOSS_FILE = "final_loss"


@dataclass(frozen=True)
class StepRecord:
    """Rank ``rank`` (process ``pid``) completed global step ``step`` at unix time ``time``."""

    rank: int
    step: int
    time: float
    pid: int

    def line(self) -> str:
        return f"{self.rank} {self.step} {self.time!r} {self.pid}\n"


def steps_file(directory: Path, rank: int) -> Path:
    return directory / f"steps_{rank}.txt"


def _parse(line: str) -> StepRecord | None:
    fields = line.split()
    if len(fields) != 4:
        return None
    try:
        return StepRecord(int(fields[0]), int(fields[1]), float(fields[2]), int(fields[3]))
    except ValueError:
        return None


def read_steps(directory: Path) -> dict[int, list[StepRecord]]:
    """Every rank's completed steps in the order written.

    A line torn by a process killed mid-write (torchrun SIGTERMs the survivors) is skipped.
    """
    ranks: dict[int, list[StepRecord]] = {}
    for path in sorted(directory.glob("steps_*.txt")):
        for line in path.read_text().splitlines():
            if (record := _parse(line)) is not None:
                ranks.setdefault(record.rank, []).append(record)
    return ranks


def read_fault_time(directory: Path) -> float:
    return float((directory / FAULT_FILE).read_text())


def read_final_loss(directory: Path) -> float:
    """Rank 0's final loss; NaN when it wrote none (its job ended otherwise)."""
    path = directory / FINAL_LOSS_FILE
    return float(path.read_text()) if path.exists() else float("nan")
