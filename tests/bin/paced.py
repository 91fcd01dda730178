"""Run a recovery script slowly for a while: ``python paced.py HOLD SCRIPT [ARGS...]``.

For a test whose job must outlast a scenario of unknown length, each step of
``recovery.train.elastic.ElasticTrainer.steps`` is followed by a :data:`PACE` s sleep
while ``HOLD`` says so:

* a file path: until the file exists (a node lost, retired and started again: the test
  releases the job once it saw it whole), then the job runs at full speed to its end;
* ``--while_degraded``: while the rank trains in a generation without some of the job's
  ranks, so that a killed rank heals long before the end however fast the machine trains,
  and the job need not be long to leave it the time.

``SCRIPT`` runs as ``python SCRIPT ARGS`` would (as ``__main__``, its folder first on
``sys.path``).
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from recovery.train.elastic import ElasticTrainer

PACE = 0.2
"""Seconds each step is held."""
WHILE_DEGRADED = "--while_degraded"

hold, script, *args = sys.argv[1:]
held: Callable[[ElasticTrainer], bool] = (
    (lambda trainer: trainer.ctx.degraded) if hold == WHILE_DEGRADED
    else (lambda trainer: not Path(hold).exists()))
steps = ElasticTrainer.steps


def paced(self: ElasticTrainer, *positional: Any, **named: Any) -> Iterator[Any]:
    for step in steps(self, *positional, **named):
        yield step
        if held(self):
            time.sleep(PACE)


ElasticTrainer.steps = paced  # type: ignore[method-assign]
sys.argv = [script, *args]
sys.path[0] = os.path.dirname(os.path.realpath(script))
runpy.run_path(script, run_name="__main__")
