"""The floors of docs/architecture.md hold: each imports only the floors below it."""

from __future__ import annotations

import ast
from pathlib import Path

from support import REPO

FLOORS = {"ground": 0, "ckpt": 1, "control": 2, "runtime": 3, "train": 4, "launcher": 5}


def _floor(module: str) -> int:
    parts = module.split(".")
    if parts[0] == "launcher":
        return FLOORS["launcher"]
    return FLOORS.get(parts[1], 0) if len(parts) > 1 else 0


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if node.module == "recovery")
    return {name for name in found if name.split(".")[0] in {"recovery", "launcher"}}


def test_no_module_imports_a_floor_above_its_own() -> None:
    upward = []
    for path in sorted((REPO / "recovery").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        if module == "recovery":
            continue  # the package's lazy table names every floor on purpose
        for name in _imports(path):
            if _floor(name) > _floor(module):
                upward.append(f"{module} imports {name}")
    assert upward == []


def test_the_check_sees_an_upward_import() -> None:
    assert _floor("recovery.train.elastic") > _floor("recovery.ckpt.checkpoint")
    assert _floor("launcher.cli") > _floor("recovery.train.elastic")
