"""Ending a process that imported torch without the interpreter's final collections, or
without its teardown at all.

At exit the interpreter runs full garbage collections over every object left, and a process
that imported torch holds hundreds of thousands: unless they are frozen first, that walk is
most of the gap between a job's last step and its end, paid once by each worker, the
scheduler and tftrun.

Freezing moves every object into the collector's permanent generation: reference counting
still frees what it frees, every atexit handler still runs, files are still flushed and
closed; only garbage held in reference cycles is left for the operating system to reclaim.

A process forked from the warm fork server pays for the rest of the teardown too: every
object it releases dirties a page it still shares with the server, which the kernel then
copies; ``os._exit`` skips all of it. tftrun's own processes, whose every durable write is done when they
return, end with :func:`exit_now`; a user's script keeps the interpreter's ending, which
flushes the files it left open.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from typing import NoReturn

__all__ = ["skip_final_collections", "exit_now"]


def skip_final_collections() -> None:
    """Call as late as possible before the process ends (the last atexit handler, or just
    before ``main`` returns)."""
    gc.freeze()


def exit_now(status: int) -> NoReturn:
    """End this process with ``status`` at once: logging's handlers and the standard
    streams are flushed; no atexit handler runs and no object is torn down."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # closed, or its reader gone: nothing more can be said there
    os._exit(status)
