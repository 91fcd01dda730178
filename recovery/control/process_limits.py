"""What the scheduler process asks of the host: room for its connections, and to be the one the OOM
killer takes.

A stranger who reaches the store's port can fill it until the host runs out of memory; better the
scheduler dies than a training rank: it is relaunched, and its death frees the store.
"""

from __future__ import annotations

import logging
import resource
from pathlib import Path

__all__ = ["OOM_SCORE_ADJ", "raise_open_files_limit", "offer_to_oom_killer"]

logger = logging.getLogger(__name__)

OOM_SCORE_ADJ = 1000
"""The kernel's highest: taken before any process left at the default 0, however large."""
_OOM_SCORE_ADJ_FILE = Path("/proc/self/oom_score_adj")


def raise_open_files_limit() -> None:
    """Raise this process's soft limit on open files to its hard limit: the store holds about two
    connections per node, and a common soft limit of 1024 would refuse a job past 500 nodes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as err:  # an unlimited hard limit the kernel caps lower
        logger.debug("open files limit kept at %d: %s", soft, err)


def offer_to_oom_killer() -> None:
    """Make this process the OOM killer's first choice (raising it needs no privilege)."""
    try:
        _OOM_SCORE_ADJ_FILE.write_text(f"{OOM_SCORE_ADJ}\n")
    except OSError as err:  # not Linux, or a /proc mounted read-only
        logger.debug("oom_score_adj left as it was: %s", err)
