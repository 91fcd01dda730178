"""Worker exit statuses reserved by tftrun: ends that no restart can fix.

tftrun ends the job at once, with that reason, when a worker exits with one of these
(docs/cli.md, *Exit status*), instead of spending its restart budget on them.
"""

from __future__ import annotations

__all__ = ["USAGE_ERROR", "REGISTRATION_REFUSED", "UNFIXABLE"]

USAGE_ERROR = 2
"""The script was called wrongly: argparse's status, and Python's for a missing script."""

REGISTRATION_REFUSED = 77
"""The scheduler refused the worker's registration for good (a wrong job token, a rank
beyond ``worker_num``, ...); ``recovery.init()`` exits with it (sysexits' EX_NOPERM)."""

UNFIXABLE = {
    USAGE_ERROR: "a usage error of the script",
    REGISTRATION_REFUSED: "its registration was refused for good",
}
"""Reserved status → why a restart cannot help."""
