"""How tftrun's options are declared: both spellings, a help panel each, booleans as flags
that still take msrun's ``--join=True`` spelling, and the options tftrun refuses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperCommand, TyperOption

from launcher.cli.common import finite_float
from launcher.errors import ConfigError
from recovery import env as names

__all__ = ["LAUNCH", "RECOVERY", "MULTI_NODE", "LOGGING", "COMPAT", "opt", "float_opt", "flag",
           "refused_opt", "parse_bool", "FlagCommand", "REFUSED", "refuse", "refused_line"]

LAUNCH, RECOVERY, MULTI_NODE, LOGGING, COMPAT = (
    "Launch", "Recovery", "Multi-node", "Logging", "torchrun/msrun compatibility")
"""The panels of ``tftrun --help``."""

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})

REFUSED: Mapping[str, str] = {
    "logs_specs": "--logs_specs: tftrun writes <log_dir>/worker_<rank>.log for each rank; it has "
                  "no logs_specs plugins",
    "numa_binding": "--numa_binding is not supported; --bind_core pins each worker to its share of "
                    "the node's cores, or bind with numactl inside the worker",
    "bind_numa": "--bind_numa is not supported; --bind_core pins each worker to its share of the "
                 "node's cores, or bind with numactl inside the worker",
    "duplicate_stdout_filters": "--duplicate_std*_filters are not supported; grep "
                                "<log_dir>/worker_*.log instead",
    "duplicate_stderr_filters": "--duplicate_std*_filters are not supported; grep "
                                "<log_dir>/worker_*.log instead",
    "virtual_local_rank": "--virtual_local_rank is not supported; use LOCAL_RANK as the device "
                          "index (docs/gpu.md)",
    "sim_level": "--sim_level is MindSpore's dry run, a simulation of Ascend devices; tftrun "
                 "runs the real job: leave it out",
    "sim_rank_id": "--sim_rank_id picks the one rank of MindSpore's Ascend dry run; tftrun runs "
                   "every rank for real: leave it out",
    "rank_table_file": "--rank_table_file is the Ascend devices' rank table (HCCL); tftrun's ranks "
                       "come from --worker_num and --node_rank: leave it out",
}
"""msrun's and torchrun's options without a meaning here → the one line that says why."""
PET_REFUSED = frozenset({"duplicate_stdout_filters", "duplicate_stderr_filters",
                         "virtual_local_rank"})
"""The refused options torchrun also reads from ``PET_<NAME>``."""


def _spellings(name: str, short: str | None = None) -> tuple[str, ...]:
    """How click knows an option: ``--name_with_underscores`` (and its short form)."""
    return (*(() if short is None else (short,)), f"--{name}")


def opt(name: str, help_text: str, panel: str, pet: bool = False, short: str | None = None,
        **settings: Any) -> Any:
    """An option, in the ``panel`` of the help; ``pet``: one of torchrun's, whose default is
    ``PET_<NAME>`` when set, as torchrun reads it (Kubeflow's PyTorchJob passes them)."""
    if pet:
        settings["envvar"] = names.pet(name)
    return typer.Option(*_spellings(name, short), help=escape(help_text), rich_help_panel=panel,
                        **settings)


def float_opt(name: str, help_text: str, panel: str, pet: bool = False) -> Any:
    """A float option (see :func:`opt`) that refuses NaN and the infinities."""
    return opt(name, help_text, panel, pet=pet, parser=finite_float)


def flag(name: str, help_text: str, panel: str, negative: bool = False, pet: bool = False,
         short: str | None = None) -> Any:
    """A boolean option given alone (``--join``); ``negative`` adds ``--no_<name>`` for one that
    is on by default. :class:`FlagCommand` also reads msrun's ``--join=True``/``False``."""
    spellings = list(_spellings(name, short))
    if negative:
        spellings[-1] += f"/--no_{name}"
    return typer.Option(*spellings, help=escape(help_text), rich_help_panel=panel, metavar="",
                        show_default=False, **({"envvar": names.pet(name)} if pet else {}))


def refused_opt(name: str) -> Any:
    """An option tftrun refuses (:data:`REFUSED`): parsed, so that its line is given, but not
    listed among the options."""
    return typer.Option(*_spellings(name), hidden=True,
                        **({"envvar": names.pet(name)} if name in PET_REFUSED else {}))


def refused_line() -> str:
    """The end of ``tftrun --help``: the refused options, in one line."""
    return escape("Refused, with one line saying why: " + ", ".join(f"--{n}" for n in REFUSED) + ".")


def refuse(params: Mapping[str, object]) -> None:
    """ConfigError (one line, exit 2) for the first refused option given."""
    for name, why in REFUSED.items():
        if params.get(name) not in (None, False):
            raise ConfigError(why)


def parse_bool(value: str, option: str) -> bool:
    """msrun's ``--join=True``/``False`` spelling, plus 1/0/yes/no/on/off."""
    lowered = value.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise ConfigError(f"{option} takes True or False, got {value!r}")


VALUED = frozenset({"join", "is_recover", "fork_server", "bind_core"})
"""msrun's booleans, which msrun scripts also write as ``--join True``."""


class FlagCommand(TyperCommand):
    """A command whose options also take their dashed spelling (``--worker-num``) and whose boolean flags
    take msrun's ``--join=True``/``--join True``, rewritten before click parses them."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, msrun_spellings(self.params, args))

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""  # a flag: no value to name
        return option


def _underscored(arg: str) -> str:
    """``--worker-num=4`` → ``--worker_num=4``: the name's dashes, not its value's."""
    name, eq, value = arg.partition("=")
    return "--" + name[2:].replace("-", "_") + eq + value


def msrun_spellings(params: Sequence[Any], args: Sequence[str]) -> list[str]:
    """``args`` with every option before the script spelled as click knows it."""
    flags: dict[str, tuple[TyperOption, bool]] = {}
    takes_value: set[str] = set()
    for param in params:
        if not isinstance(param, TyperOption):
            continue
        if param.is_flag and param.is_bool_flag:
            flags.update({s: (param, True) for s in param.opts})
            flags.update({s: (param, False) for s in param.secondary_opts})
        elif not param.is_flag:
            takes_value.update(param.opts)
    out: list[str] = []
    at = 0
    while at < len(args):
        arg = args[at]
        if arg == "--" or arg == "-" or not arg.startswith("-"):
            break  # the script: what follows is its own
        if arg.startswith("--"):
            arg = _underscored(arg)
        name, eq, value = arg.partition("=")
        at += 1
        if name in flags:
            param, positive = flags[name]
            if not eq and param.name in VALUED and at < len(args) and (
                    args[at].strip().lower() in TRUE_WORDS | FALSE_WORDS):
                eq, value = "=", args[at]
                at += 1
            if eq:
                on = parse_bool(value, name) == positive
                out += [param.opts[0]] if on else param.secondary_opts[:1]
                continue
        out.append(arg)
        if not eq and name in takes_value and at < len(args):
            out.append(args[at])
            at += 1
    return out + list(args[at:])
