"""``tftctl ckpt``: list, verify and show checkpoints. ``ls`` and ``verify`` take a rank's directory or any
folder above it and check every file fully; ``ls`` lists only the lineage a job would consider (``--all``:
every lineage's, earlier jobs' included)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from launcher.cli.common import new_app
from launcher.errors import TftrunError
from recovery.ckpt.layout import rank_of_dir
from recovery.ckpt.lineage import LineageError, read_lineage
from recovery.ckpt.manifest import Candidate, CheckpointError, candidates, find_checkpoint_dirs, verify_dir

__all__ = ["app"]

app = new_app("ckpt", "Inspect and verify checkpoints.")

_Dir = Annotated[Path, typer.Argument(help="A rank's checkpoint directory, or a folder above several.",
                                       exists=True, file_okay=False)]
_File = Annotated[Path, typer.Argument(help="A checkpoint file (<prefix>-<epoch>_<step>.ckpt).",
                                        exists=True, dir_okay=False)]
_All = Annotated[bool, typer.Option("--all", help="List the checkpoints of every lineage, not only the current one.")]
_LINEAGE_LEVELS = 3
"""How far above a folder its lineage may be recorded: in the recovery path (rank_<r> -> checkpoints -> it)
or a last-words step directory."""


def _verified(root: Path, lineage: str | None = None) -> list[tuple[Candidate, str | None]]:
    results = [result for directory in find_checkpoint_dirs(root) for result in verify_dir(directory, lineage)]
    return sorted(results, key=lambda r: (_rank(r[0]), str(r[0].path.parent), r[0].epoch, r[0].step_in_epoch))


def current_lineage(root: Path) -> str | None:
    """The lineage recorded at ``root`` or just above it; ``None`` if none is."""
    root = root.resolve()
    for directory in (root, *root.parents[:_LINEAGE_LEVELS]):
        try:
            found = read_lineage(directory)
        except LineageError:
            found = None
        if found is not None:
            return found
    return None


def _rank(candidate: Candidate) -> int:
    if candidate.entry is not None:
        return candidate.entry.rank
    rank = rank_of_dir(candidate.path.parent)
    return -1 if rank is None else rank


def _size(candidate: Candidate) -> str:
    try:
        return str(candidate.path.stat().st_size)
    except FileNotFoundError:
        return "-"


@app.command("ls")
def ls(directory: _Dir, every_lineage: _All = False) -> None:
    """List checkpoints: rank, epoch, step, size, time written, valid (or why not), lineage."""
    lineage = None if every_lineage else current_lineage(directory)
    shown = _verified(directory, lineage)
    table = Table("rank", "epoch", "step", "size", "time", "valid", "lineage", "file")
    for candidate, reason in shown:
        rank = _rank(candidate)
        written = ("-" if candidate.entry is None
                   else datetime.fromtimestamp(candidate.entry.time).strftime("%Y-%m-%d %H:%M:%S"))
        table.add_row(
            "?" if rank < 0 else str(rank), str(candidate.epoch), str(candidate.step_in_epoch), _size(candidate),
            written, "yes" if reason is None else f"no: {reason}",
            "?" if candidate.entry is None else candidate.entry.lineage or "none", str(candidate.path),
        )
    # Off a terminal (pipes, tests) rich would squeeze the table into 80 columns.
    Console(width=None if sys.stdout.isatty() else 240).print(table)
    if lineage is not None:
        hidden = sum(len(candidates(d)) for d in find_checkpoint_dirs(directory)) - len(shown)
        print(f"lineage {lineage}" + (f"; {hidden} checkpoint(s) of other lineages not listed "
                                      "(--all lists them)" if hidden else ""))


@app.command("verify")
def verify(directory: _Dir) -> None:
    """Check every checkpoint; exit 1 naming each bad file and why."""
    results = _verified(directory)
    bad = [(candidate, reason) for candidate, reason in results if reason is not None]
    for candidate, reason in bad:
        print(f"bad: {candidate.path}: {reason}", file=sys.stderr)
    if bad:
        raise typer.Exit(1)
    print(f"ok: {len(results)} checkpoint(s) valid under {directory}")


def _leaves(obj: Any, path: str) -> Iterator[tuple[str, str]]:
    import torch  # here, not at the top: every tftctl command imports this module

    if isinstance(obj, torch.Tensor):
        yield path, f"tensor {tuple(obj.shape)} {str(obj.dtype).removeprefix('torch.')}"
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _leaves(value, f"{path}.{key}" if path else str(key))
    elif isinstance(obj, (list, tuple)) and any(isinstance(v, (torch.Tensor, dict, list, tuple)) for v in obj):
        for index, value in enumerate(obj):
            yield from _leaves(value, f"{path}[{index}]")
    else:
        yield path, repr(obj)


@app.command("show")
def show(file: _File) -> None:
    """Show a checkpoint's keys, tensor shapes and append_info (after verifying it)."""
    from recovery.ckpt.restore import load_checkpoint  # imports torch: only for this command

    try:
        state = load_checkpoint(file)
    except CheckpointError as err:
        raise TftrunError(str(err)) from None
    print(f"file: {file}")
    print(f"keys: {', '.join(state)}")
    for path, description in _leaves(state, ""):
        print(f"  {path}: {description}")
