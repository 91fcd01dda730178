"""The training frameworks a script imports at its top level, which the fork server imports before it forks:
only :data:`FRAMEWORKS`, as a module of the user's own may start threads or do work that a fork must not inherit.
"""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["FRAMEWORKS", "framework_imports"]

FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers", "accelerate")


def framework_imports(script: Path) -> str:
    """``script``'s top-level :data:`FRAMEWORKS` imports as ``TFT_PRELOAD``: ``module[:name,name]`` joined by
    ``;``, names kept since those packages load their parts on first use. Empty when the script cannot be
    parsed; a framework shadowed by a module in the script's folder is left out."""
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
