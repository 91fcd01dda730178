"""Run a recovery script slowly until a file exists: ``python paced.py RELEASE SCRIPT [ARGS...]``.

For a test whose job must outlast a scenario of unknown length (a node lost, retired and
started again): each step of ``recovery.train.elastic.ElasticTrainer.steps`` is followed by
a :data:`PACE` s sleep until the file ``RELEASE`` exists, then the job runs at full speed
to its end. ``SCRIPT`` runs as ``python SCRIPT ARGS`` would (as ``__main__``, its folder
first on ``sys.path``).
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from recovery.train.elastic import ElasticTrainer

PACE = 0.2
"""Seconds each step is held while the release file is missing."""

release, script, *args = sys.argv[1:]
steps = ElasticTrainer.steps


def paced(self: ElasticTrainer, *positional: Any, **named: Any) -> Iterator[Any]:
    for step in steps(self, *positional, **named):
        yield step
        if not Path(release).exists():
            time.sleep(PACE)


ElasticTrainer.steps = paced  # type: ignore[method-assign]
sys.argv = [script, *args]
sys.path[0] = os.path.dirname(os.path.realpath(script))
runpy.run_path(script, run_name="__main__")
