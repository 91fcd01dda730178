"""Shared bench helpers: free ports, the two launchers' command lines, medians, and the
``--json`` output every bench offers (``add_json_flag`` + ``emit``)."""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def absolute_pythonpath() -> None:
    """Make ``PYTHONPATH``'s entries absolute (``PYTHONPATH=.`` as the benches are run):
    tftrun starts its scheduler and workers from other folders."""
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(str(Path(e).resolve()) for e in entries if e)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tftrun_cmd(workers: int, log_dir: Path, *script: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "launcher.cli.tftrun", f"--worker_num={workers}",
            f"--log_dir={log_dir}", f"--master_port={free_port()}", *extra, *script]


def torchrun_cmd(workers: int, log_dir: Path, *script: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={workers}",
            f"--master_port={free_port()}", f"--log_dir={log_dir}", "--redirects=3", *extra,
            *script]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio_line(name: str, tft: float, torch_value: float, target: str) -> str:
    return (f"{name:<32} tftrun {tft:8.3f}  torchrun {torch_value:8.3f}  "
            f"ratio {ratio(tft, torch_value):6.2f}  (target {target})")


def ratio(value: float, baseline: float) -> float:
    """``value / baseline``; NaN where there is no baseline (``emit`` writes it as null)."""
    return value / baseline if baseline else float("nan")


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Give a bench the ``--json`` flag that ``emit`` obeys."""
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object with the figures and ratios instead of the text report")


def _plain_json(value: Any) -> Any:
    """``value`` with NaN and infinities as null (strict JSON has no spelling for them) and
    tuples and paths as lists and strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _plain_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_json(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def emit(result: dict[str, Any], as_json: bool, text: Iterable[str] = ()) -> None:
    """A bench's one output: with ``--json`` the object ``result`` (figures and ratios) as
    one line of strict JSON on stdout, else the human ``text`` lines. Progress a bench
    prints while it runs belongs on stderr, so that stdout stays one JSON object."""
    if as_json:
        print(json.dumps(_plain_json(result), allow_nan=False))
    else:
        print("\n".join(text))
