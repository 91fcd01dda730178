"""``tftctl``: look at and act on a tftrun job from another terminal."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated

import typer

from launcher.cli import ckpt, inject, new, report, status
from launcher.cli.common import new_app, print_version, run_app

__all__ = ["app", "main"]

app = new_app("tftctl", "Inspect and control tftrun jobs and their checkpoints.")


@app.callback()
def tftctl(version: Annotated[bool, typer.Option(
        "--version", help="Print tftctl's version and exit.", callback=print_version("tftctl"),
        is_eager=True)] = False) -> None:
    """Inspect and control tftrun jobs and their checkpoints."""


app.add_typer(ckpt.app, name="ckpt")
app.command(name="new")(new.new)
app.command(name="status")(status.status)
app.command(name="inject")(inject.inject)
app.command(name="report")(report.report)


def main(argv: Sequence[str] | None = None) -> int:
    return run_app(app, "tftctl", argv)


if __name__ == "__main__":
    sys.exit(main())
