"""What an ended process tells us: exit code or signal, phrased for the user."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ExitInfo", "read_error_file"]


@dataclass(frozen=True)
class ExitInfo:
    """How one process ended. ``returncode`` follows Popen: negative for a signal."""

    role: str
    rank: int | None
    pid: int
    incarnation: int
    returncode: int
    at: float
    """When the supervisor saw it end (monotonic: deadlines are counted from it)."""
    expected: bool = False
    """True when the supervisor itself stopped the process (not a fault)."""

    @property
    def signal_name(self) -> str | None:
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"SIG{-self.returncode}"

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0

    @property
    def exit_status(self) -> int:
        """The status a shell would report for it: 128+N for signal N."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    @property
    def outcome(self) -> str:
        """The ``exit`` event's ``outcome``: ``stopped`` (by tftrun), ``clean`` (status 0) or
        ``failed``."""
        if self.expected:
            return "stopped"
        return "clean" if self.succeeded else "failed"

    def describe(self) -> str:
        """One phrase for logs and the summary, e.g. ``killed by SIGKILL (out of memory?)``."""
        if self.signal_name is None:
            return f"exited with code {self.returncode}"
        hint = " (kill -9, or out of memory?)" if self.returncode == -signal.SIGKILL else ""
        return f"killed by {self.signal_name}{hint}"

    def fields(self) -> dict[str, object]:
        """The ``exit`` event's fields: ``exitcode`` or ``signal``, never both."""
        fields: dict[str, object] = {
            "role": self.role, "rank": self.rank, "pid": self.pid,
            "incarnation": self.incarnation, "expected": self.expected, "outcome": self.outcome,
        }
        if self.signal_name is None:
            fields["exitcode"] = self.returncode
        else:
            fields["signal"] = self.signal_name
        return fields


def read_error_file(path: Path) -> str | None:
    """The root cause a worker's ``@record`` (torch.distributed.elastic) left in its error
    file: the exception's line, then its traceback, as torchrun's failure table shows them;
    None when there is no readable one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        text = str(message.get("message") or "").strip() or None
        if text is not None and isinstance(stack, str) and stack.strip():
            return f"{text}\n{stack.rstrip()}"
        return text
    return str(message).strip() or None if message else None
