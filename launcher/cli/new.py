"""``tftctl new``: copy a ready training or launch script out of the installed templates."""

from __future__ import annotations

import shutil
from importlib.resources import as_file, files
from pathlib import Path
from typing import Annotated

import typer

from launcher.errors import ConfigError

__all__ = ["new", "available_templates"]

_SKIP = {"__init__.py", "__pycache__"}


def _templates_root() -> Path:
    with as_file(files("launcher.templates")) as root:
        return Path(root)


def available_templates() -> list[str]:
    """Template names: each folder (a training script and its helpers) and launch script."""
    return sorted(p.name for p in _templates_root().iterdir()
                  if p.name not in _SKIP and not p.name.startswith("."))


def _copy_tree(source: Path, dest: Path) -> list[Path]:
    written = []
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if any(part in _SKIP for part in relative.parts) or path.is_dir():
            continue
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        written.append(target)
    return written


def new(
    name: Annotated[str, typer.Argument(help="The template: a folder such as 'mnist', or a "
                                        "launch script such as 'run.sh'.")],
    dest: Annotated[Path | None, typer.Argument(
        help="Where to put it. [default: ./NAME]", show_default=False)] = None,
) -> None:
    """Copy a template to DEST; never overwrites an existing file or folder."""
    names = available_templates()
    if name not in names:
        raise ConfigError(f"no template named {name!r}; available: {', '.join(names)}")
    source = _templates_root() / name
    dest = Path(name) if dest is None else dest
    if dest.exists():
        raise ConfigError(f"{dest} already exists; choose another destination")
    if source.is_dir():
        written = _copy_tree(source, dest)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)
        written = [dest]
    for path in written:
        print(path)
