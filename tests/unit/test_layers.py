"""The floors of docs/architecture.md hold: each imports only the floors below it.

``recovery``: ground < ckpt < control < runtime < train < the framework callbacks
(``recovery.lightning``, ``recovery.hf``: they import their framework, and nothing in
``recovery`` imports them). ``launcher`` stands on all of
``recovery`` and has floors of its own: ground (config, errors) < procs < nodes < view <
report < supervisor < cli. A module may import its own package and any floor below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from support import REPO

RECOVERY_FLOORS = ("ckpt", "control", "runtime", "train")
FRAMEWORK_CALLBACKS = ("lightning", "hf")
LAUNCHER_FLOORS = ("procs", "nodes", "view", "report", "supervisor", "cli")


def _floor(module: str) -> int:
    """The floor of a dotted module name: higher floors may import lower ones."""
    top, _, rest = module.partition(".")
    package = rest.split(".")[0]
    if top == "recovery":
        if package in FRAMEWORK_CALLBACKS:
            return len(RECOVERY_FLOORS) + 1
        return RECOVERY_FLOORS.index(package) + 1 if package in RECOVERY_FLOORS else 0
    base = len(RECOVERY_FLOORS) + 2
    return base + (LAUNCHER_FLOORS.index(package) + 1 if package in LAUNCHER_FLOORS else 0)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if node.module in {"recovery", "launcher"} or node.module.count(".") == 1)
    return {name for name in found if name.split(".")[0] in {"recovery", "launcher"}}


def _upward(package: str) -> list[str]:
    upward = []
    for path in sorted((REPO / package).rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        if module == "recovery":
            continue  # the package's lazy table names every floor on purpose
        for name in _imports(path):
            if _floor(name) > _floor(module):
                upward.append(f"{module} imports {name}")
    return upward


@pytest.mark.parametrize("package", ["recovery", "launcher"])
def test_no_module_imports_a_floor_above_its_own(package: str) -> None:
    assert _upward(package) == []


def test_the_check_sees_an_upward_import() -> None:
    assert _floor("recovery.train.elastic") > _floor("recovery.ckpt.checkpoint")
    assert _floor("recovery.lightning") > _floor("recovery.train.elastic") > _floor("recovery.peer_loss")
    assert _floor("launcher.config") > _floor("recovery.train.elastic")
    assert _floor("launcher.cli.tftrun") > _floor("launcher.supervisor.loop")
    assert _floor("launcher.supervisor.loop") > _floor("launcher.procs.process")
    assert _floor("launcher.procs.process") > _floor("launcher.errors")
    assert _floor("launcher.report.sources") > _floor("launcher.view.logs")
