"""A warm spare worker (``tftrun --warm_spare``), run as ``python -u spare.py GO_FD``.

It pays a worker's cold start ahead of need (``import torch``, the first optimizer step,
which imports ``torch._dynamo``, and the ``recovery`` library where it can be imported),
at a lower CPU priority where it may go back (recovery/priority.py), while it reads one
JSON message from the pipe ``GO_FD`` until EOF: ``env``, ``argv`` (the script and its
arguments), ``cwd`` and ``log``. On it, the process becomes that rank's worker: its
output goes to the rank's log, ``os.environ`` is replaced by the rank's, and the script
runs as ``__main__``, so its exit status is the script's (``sys.exit(n)`` gives n, an uncaught exception a
traceback and 1). An empty pipe (the supervisor is gone, or retired the spare) ends it
quietly with status 0.

Started by path, not with ``-m``, and importing nothing but the standard library, torch
and recovery (its light ``recovery.priority`` first, the library after torch): the
script finds ``sys.modules`` and ``sys.path`` as a fresh ``python -u script.py`` would,
apart from those being imported already.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from typing import Any

READY = "warm"
"""Printed (with the pid) to the spare's own log once the cold start is paid."""


def warm_up() -> None:
    """Import what every worker imports, and build and step an optimizer once."""
    import torch
    import torch.distributed  # noqa: F401

    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    torch.optim.SGD([param], lr=0.1).step()
    try:
        # The library the scripts that get relaunched alone import (about 0.1 s more).
        import recovery.ckpt.checkpoint  # noqa: F401
        import recovery.train.elastic  # noqa: F401
    except ImportError:
        pass


class GoListener:
    """Reads the supervisor's message in a thread while the spare warms up, and puts the
    spare back to its priority the moment a message (or EOF) arrives: a spare handed a
    rank before it is warm finishes warming up at a worker's priority."""

    def __init__(self, fd: int, priority: int | None) -> None:
        self._fd = fd
        self._priority = priority
        self.message: dict[str, Any] | None = None
        self._thread = threading.Thread(target=self._listen, name="tftrun-spare-go", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        from recovery.priority import restore_priority

        self.message = wait_for_go(self._fd)
        if self._priority is not None:
            restore_priority(self._priority)

    def wait(self) -> dict[str, Any] | None:
        self._thread.join()
        return self.message


def wait_for_go(fd: int) -> dict[str, Any] | None:
    """The supervisor's message, or None at EOF without one."""
    with os.fdopen(fd, "rb") as pipe:
        data = pipe.read()
    return json.loads(data) if data else None


def become(message: dict[str, Any]) -> None:
    """Turn this process into the worker that ``message`` describes and run its script."""
    from recovery.safe_files import open_append

    log_fd = open_append(message["log"])
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.environ.clear()
    os.environ.update(message["env"])
    os.chdir(message["cwd"])
    script = message["argv"][0]
    sys.argv = list(message["argv"])
    # What `python script.py` puts first on sys.path: the script's (real) folder.
    sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    started = time.monotonic()
    # This file's folder (launcher/) must not shadow a module that torch imports.
    sys.path.pop(0)
    from recovery.priority import lower_priority
    from recovery.quick_exit import skip_final_collections

    go = GoListener(int(sys.argv[1]), lower_priority())
    warm_up()
    print(f"tftrun spare pid={os.getpid()}: {READY} after {time.monotonic() - started:.2f}s",
          flush=True)
    message = go.wait()
    if message is None:
        skip_final_collections()  # retired idle: end at once, not after a full collection
    else:
        become(message)


if __name__ == "__main__":
    main()
