"""The control plane: the scheduler process, its membership rules, requests and replies, and
the supervisor's client (SchedulerControl)."""

from __future__ import annotations

import importlib
from typing import Any

# The client's names, loaded on first use (PEP 562): the launcher imports the client without the
# scheduler's modules.
_CLIENT = ("SchedulerControl", "ExitReport")


def __getattr__(name: str) -> Any:
    if name not in _CLIENT:
        raise AttributeError(f"module 'recovery.control' has no attribute {name!r}")
    return getattr(importlib.import_module("recovery.control.client"), name)
