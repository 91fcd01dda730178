"""The frameworks a script imports, which the fork server imports before it forks.

A worker's cold start is mostly imports: torch, which the fork server always imports, and
the training framework (Lightning, Hugging Face Transformers, Accelerate), which costs as
much again. The fork server imports those the script imports at its top level, so that
every worker, and every relaunch, finds them imported already (docs/cli.md, *The fork
server*). Only :data:`FRAMEWORKS`: a module of the user's own may start threads or do
work at import that a fork must not inherit.
"""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["FRAMEWORKS", "framework_imports"]

FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers", "accelerate")


def framework_imports(script: Path) -> str:
    """The :data:`FRAMEWORKS` imports of ``script``'s top level, as the fork server's
    ``TFT_PRELOAD``: ``module[:name,name]`` joined by ``;`` (``from transformers import
    Trainer`` is ``transformers:Trainer``: the package loads its parts on first use).
    Empty when the script cannot be read or parsed, and without a framework that the
    script's folder holds a module of (the worker imports that one)."""
    try:
        tree = ast.parse(script.read_text(encoding="utf-8"), str(script))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return ""
    own = {path.stem for path in script.parent.iterdir()} if script.parent.is_dir() else set()
    specs: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            specs += [alias.name for alias in node.names if _framework(alias.name, own)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and _framework(node.module, own):
            specs.append(f"{node.module}:{','.join(alias.name for alias in node.names)}")
    return ";".join(specs)


def _framework(module: str, own: set[str]) -> bool:
    top = module.split(".")[0]
    return top in FRAMEWORKS and top not in own
