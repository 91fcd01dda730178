"""Worker exit statuses reserved by tftrun: ends that no restart can fix, so tftrun ends the
job at once on them (docs/cli.md, *Exit status*) instead of spending its restart budget."""

from __future__ import annotations

__all__ = ["USAGE_ERROR", "REGISTRATION_REFUSED", "UNFIXABLE"]

USAGE_ERROR = 2
"""The script was called wrongly: argparse's status, and Python's for a missing script."""

REGISTRATION_REFUSED = 77
"""The scheduler refused the worker's registration for good; ``recovery.init()`` exits with
it (sysexits' EX_NOPERM)."""

UNFIXABLE = {
    USAGE_ERROR: "a usage error of the script",
    REGISTRATION_REFUSED: "its registration was refused for good",
}
"""Reserved status → why a restart cannot help."""
