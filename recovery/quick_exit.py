"""Ending a process that imported torch without the interpreter's final collections, which
walk every object torch left, or without its teardown at all, which in a process forked from
the fork server copies shared pages: tftrun's own processes, their durable writes done, skip
it with :func:`exit_now`; a user's script keeps the normal ending, which flushes its files."""

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
