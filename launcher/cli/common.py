"""Running a typer app so that every usage error is one line on stderr and exit 2."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence

import typer

from launcher.errors import TftrunError

__all__ = ["new_app", "run_app", "fail", "finite_float", "HELP_OPTIONS", "print_version"]

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}
"""Context settings: ``-h`` is ``--help``, for every command."""


def new_app(name: str, help_text: str, panels: bool = False) -> typer.Typer:
    """A typer app; ``panels``: its help groups options in panels (rich), so every help text
    given to it must be escaped for rich markup."""
    return typer.Typer(
        name=name,
        help=help_text,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode="rich" if panels else None,
        no_args_is_help=False,
        context_settings=HELP_OPTIONS,
    )


def print_version(prog: str) -> Callable[[bool], None]:
    """An eager ``--version`` option's callback: print ``<prog> <version>`` and exit 0."""
    def callback(value: bool) -> None:
        if value:
            from importlib import metadata  # only here: every start would pay for its import

            try:
                version = metadata.version("tftrun")
            except metadata.PackageNotFoundError:
                version = "(not installed)"
            print(f"{prog} {version}")
            raise typer.Exit(0)
    return callback


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
