"""``tftctl``: look at and act on a tftrun job from another terminal."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from launcher.cli import ckpt, inject, new, report, status
from launcher.cli.common import new_app, run_app

__all__ = ["app", "main"]

app = new_app("tftctl", "Inspect and control tftrun jobs and their checkpoints.")
app.add_typer(ckpt.app, name="ckpt")
app.command(name="new")(new.new)
app.command(name="status")(status.status)
app.command(name="inject")(inject.inject)
app.command(name="report")(report.report)


def main(argv: Sequence[str] | None = None) -> int:
    return run_app(app, "tftctl", argv)


if __name__ == "__main__":
    sys.exit(main())
