"""Shared bench helpers: free ports, the two launchers' command lines, medians."""

from __future__ import annotations

import socket
import statistics
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tftrun_cmd(workers: int, log_dir: Path, *script: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "launcher.cli", f"--worker_num={workers}",
            f"--log_dir={log_dir}", f"--master_port={free_port()}", *extra, *script]


def torchrun_cmd(workers: int, log_dir: Path, *script: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={workers}",
            f"--master_port={free_port()}", f"--log_dir={log_dir}", "--redirects=3", *extra,
            *script]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio_line(name: str, tft: float, torch_value: float, target: str) -> str:
    ratio = tft / torch_value if torch_value else float("nan")
    return (f"{name:<32} tftrun {tft:8.3f}  torchrun {torch_value:8.3f}  "
            f"ratio {ratio:6.2f}  (target {target})")
