"""``tftctl``: look at and act on a tftrun job from another terminal."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from launcher import ckpt_cli, inject_cli, new_cli, report_cli, status_cli
from launcher.cliutil import new_app, run_app

__all__ = ["app", "main"]

app = new_app("tftctl", "Inspect and control tftrun jobs and their checkpoints.")
app.add_typer(ckpt_cli.app, name="ckpt")
app.command(name="new")(new_cli.new)
app.command(name="status")(status_cli.status)
app.command(name="inject")(inject_cli.inject)
app.command(name="report")(report_cli.report)


def main(argv: Sequence[str] | None = None) -> int:
    return run_app(app, "tftctl", argv)


if __name__ == "__main__":
    sys.exit(main())
