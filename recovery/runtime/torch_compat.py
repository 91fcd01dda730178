"""The private torch.distributed calls recovery needs, in one place, for one torch version.

Private names change without notice, so importing this module checks the torch version and
fails with one clear message rather than an ``AttributeError`` deep inside a recovery.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed.distributed_c10d as c10d

__all__ = ["WRITTEN_FOR", "TorchVersionError", "check_version", "reset_group_count",
           "set_default_group_timeout", "abort_default_group"]

WRITTEN_FOR = (2, 13)
"""The torch release (major, minor) whose private API this module uses."""


class TorchVersionError(ImportError):
    """torch is not the release recovery's private calls were written for."""


def check_version(version: str) -> None:
    """Raise :class:`TorchVersionError` unless ``version`` (e.g. ``2.13.0+cpu``) is
    :data:`WRITTEN_FOR`."""
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        major, minor = -1, -1
    if (major, minor) != WRITTEN_FOR:
        wanted = ".".join(map(str, WRITTEN_FOR))
        raise TorchVersionError(
            f"recovery uses private torch.distributed calls written for torch {wanted}.x, "
            f"but torch {version} is installed: install torch {wanted}, or port "
            f"recovery/runtime/torch_compat.py to this release")


check_version(torch.__version__)


def reset_group_count() -> None:
    """Forget the process groups torch has numbered so far: a failed ``init_process_group``
    still uses up a group name, after which this rank's rendezvous keys would not match its
    peers'."""
    c10d._world.group_count = 0


def set_default_group_timeout(timeout: timedelta) -> None:
    """Set the default group's timeout after it formed (the rendezvous used another)."""
    c10d._set_pg_timeout(timeout)


def abort_default_group() -> None:
    """Abort every process group and forget them (``ncclCommAbort``), as torch documents for
    leaving an NCCL group whose collective may never complete; NCCL only."""
    c10d._abort_process_group()
