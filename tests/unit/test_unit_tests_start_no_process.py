"""A unit test starts no process: a test that forks, spawns or runs a command belongs in
tests/integration, where the suite's timing and clean-up rules for processes apply. Read
from the sources, so a new unit test that starts one is refused before it runs."""

from __future__ import annotations

import ast
from pathlib import Path

UNIT = Path(__file__).resolve().parent

# Modules whose only use is to start processes.
PROCESS_MODULES = frozenset({"subprocess", "multiprocessing", "pty"})
# os's calls that start a process or replace this one.
OS_STARTS = frozenset({"fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "popen"})
OS_START_PREFIXES = ("spawn", "exec")
# Helpers that start a process, by the module that holds them.
STARTERS = {
    "support": frozenset({"spawn", "run", "run_together", "run_gated_with_kills"}),
    "support.multinode": frozenset({"start_nodes"}),
    "launcher.procs.process": frozenset({"spawn"}),
    "concurrent.futures": frozenset({"ProcessPoolExecutor"}),
}


def _starts_a_process(name: str) -> bool:
    return name in OS_STARTS or name.startswith(OS_START_PREFIXES)


def process_starts(source: str) -> list[str]:
    """Each line of ``source`` that imports or calls something that starts a process."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {alias.name}" for alias in node.names
                      if alias.name.split(".")[0] in PROCESS_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = {alias.name for alias in node.names}
            if node.module.split(".")[0] in PROCESS_MODULES:
                found.append(f"{node.lineno}: from {node.module} import ...")
            elif node.module == "os":
                found += [f"{node.lineno}: from os import {name}" for name in sorted(names)
                          if _starts_a_process(name)]
            else:
                found += [f"{node.lineno}: from {node.module} import {name}"
                          for name in sorted(names & STARTERS.get(node.module, frozenset()))]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "os" and _starts_a_process(node.attr)):
            found.append(f"{node.lineno}: os.{node.attr}")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def test_the_check_sees_each_way_of_starting_a_process() -> None:
    source = ("import subprocess\nimport multiprocessing.pool\nfrom pty import fork\n"
              "from os import posix_spawn, getpid\nfrom support import run, wait_for\n"
              "from launcher.procs.process import Child, spawn\n"
              "from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor\n"
              "os.fork()\nos.execv('x', [])\nos.getpid()\n"
              "from torch.distributed.elastic.multiprocessing import Std\n")
    assert process_starts(source) == [
        "1: import subprocess", "2: import multiprocessing.pool", "3: from pty import ...",
        "4: from os import posix_spawn", "5: from support import run",
        "6: from launcher.procs.process import spawn",
        "7: from concurrent.futures import ProcessPoolExecutor", "8: os.fork", "9: os.execv"]


def test_no_unit_test_starts_a_process() -> None:
    starting = {path.name: starts for path in sorted(UNIT.glob("*.py"))
                if (starts := process_starts(path.read_text()))}
    assert not starting, ("these unit tests start processes; move those tests to "
                          f"tests/integration: {starting}")
