"""Every process this pytest process starts, by whichever way: a fork, a posix_spawn or
subprocess's fork_exec. The unit tests' conftest fails a test that starts one, where a
reading of its source cannot see it (product code that forks, as the checkpoint writer)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

# Each way a Python process starts another; subprocess's is bound when it is imported.
_WAYS: tuple[tuple[ModuleType, str], ...] = (
    (os, "fork"), (os, "forkpty"), (os, "posix_spawn"), (os, "posix_spawnp"),
    (subprocess, "_fork_exec"))


@contextmanager
def process_starts() -> Iterator[list[str]]:
    """Yields the names of the calls that started a process while it is entered."""
    started: list[str] = []
    originals = {(module, name): getattr(module, name) for module, name in _WAYS if hasattr(module, name)}

    def counted(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def start(*args: Any, **kwargs: Any) -> Any:
            started.append(name)
            return call(*args, **kwargs)
        return start

    for (module, name), call in originals.items():
        setattr(module, name, counted(f"{module.__name__}.{name}", call))
    try:
        yield started
    finally:
        for (module, name), call in originals.items():
            setattr(module, name, call)
