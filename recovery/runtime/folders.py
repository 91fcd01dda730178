"""The folders a job writes into, refused as tftrun refuses them when no tftrun checked them:
in a process started by hand, or by ``templates/run.sh`` (``python -m`` of this module).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from recovery import env as names
from recovery.env import WorkerEnv
from recovery.exit_codes import USAGE_ERROR
from recovery.safe_files import UnsafeFolder as Unsafe
from recovery.safe_files import resolved_folder

__all__ = ["UnsafeFolder", "folder_refusal", "checked", "main"]

logger = logging.getLogger(__name__)

_FOLDERS = (names.TFT_LOG_DIR, names.MS_RECOVERY_PATH)


class UnsafeFolder(SystemExit):
    """A folder the job would write into is not the user's own. Uncaught, it ends the
    process with status 2, which tells tftrun that no restart can fix it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = USAGE_ERROR


def folder_refusal(environ: Mapping[str, str]) -> str | None:
    """Why the job must not write into the folders ``environ`` names, or None. A folder
    not made yet is not refused: the job makes it its own."""
    for variable in _FOLDERS:
        value = environ.get(variable)
        if not value or not os.path.lexists(value):
            continue
        try:
            resolved_folder(Path(value))
        except Unsafe as problem:
            return f"{variable} {value}: {problem}"
    return None


def checked(worker_env: WorkerEnv) -> WorkerEnv:
    """``worker_env``, once the folders of this process's environment are found safe;
    :class:`UnsafeFolder` (logged first) when one is not."""
    refusal = folder_refusal(os.environ)
    if refusal is not None:
        logger.error("%s", refusal)
        raise UnsafeFolder(refusal)
    return worker_env


def main() -> int:
    refusal = folder_refusal(os.environ)
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return USAGE_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
