"""The library a training script imports to survive faults under tftrun.

See docs/ for the recovery modes. Nothing here imports the launcher, typer or rich.
"""

from __future__ import annotations

from recovery.env import WorkerEnv

__all__ = ["WorkerEnv"]
