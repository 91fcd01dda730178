"""Holds a worker's interpreter in its finalization until the test lets it go.

Python imports ``sitecustomize`` at start-up from its path: a test puts this folder
first on ``PYTHONPATH`` and names a folder in ``FINALIZATION_GATE``. Then every worker
(``MS_ROLE=MS_WORKER``), once its interpreter is finalizing (where torch's teardown spends
seconds on a loaded host), writes ``<pid>.finalizing`` in that folder and waits for a file
``go`` there, at most a minute. The moment a test needs, such as the scheduler coming back
while a worker finalizes, is then reached every time rather than by chance. Any other
process is left alone.
"""

from __future__ import annotations

import os
import time


class _Gate:
    def __init__(self, folder: str) -> None:
        self.folder = folder

    # Runs while the modules are being cleared: it uses only what its defaults bound.
    def __del__(self, join=os.path.join, exists=os.path.exists, getpid=os.getpid,
                monotonic=time.monotonic, sleep=time.sleep, open=open, limit=60.0) -> None:
        open(join(self.folder, f"{getpid()}.finalizing"), "w").close()
        deadline = monotonic() + limit
        while not exists(join(self.folder, "go")) and monotonic() < deadline:
            sleep(0.02)


if os.environ.get("FINALIZATION_GATE") and os.environ.get("MS_ROLE") == "MS_WORKER":
    _gate = _Gate(os.environ["FINALIZATION_GATE"])
