"""Running a typer app so that every usage error is one line on stderr and exit 2."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

import typer

from launcher.errors import TftrunError

__all__ = ["new_app", "run_app", "fail", "finite_float"]


def new_app(name: str, help_text: str) -> typer.Typer:
    return typer.Typer(
        name=name,
        help=help_text,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        no_args_is_help=False,
    )


def finite_float(value: str | float) -> float:
    """A float option's value; NaN and the infinities are usage errors (a NaN timeout
    compares false with everything, so every check against it would pass)."""
    try:
        number = float(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise typer.BadParameter(f"{value!r} is not a finite number")
    return number


def fail(prog: str, message: str, code: int) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def run_app(app: typer.Typer, prog: str, argv: Sequence[str] | None = None) -> int:
    """Run ``app`` and return its exit status instead of letting click print a usage block."""
    command = typer.main.get_command(app)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = command.main(args, prog_name=prog, standalone_mode=False)
    except typer.Exit as done:
        return done.exit_code
    except typer.Abort:
        return fail(prog, "aborted", 130)
    except typer.TyperException as err:
        # typer >= 0.29 vendors click: its usage errors (exit code 2) derive from this.
        message = err.format_message().splitlines()[0]
        code = getattr(err, "exit_code", 1)
        hint = f" (see '{prog} --help')" if code == 2 else ""
        return fail(prog, message + hint, code)
    except TftrunError as err:
        return fail(prog, str(err), err.exit_code)
    return result if isinstance(result, int) else 0
