"""tftrun's own processes never import a module planted in the working folder, even
when ``PYTHONPATH`` has an empty entry (``PYTHONPATH=:/x``, which ``-P`` does not drop;
issue 38), while its workers keep the ``sys.path`` torchrun would give them.

The planted ``recovery/`` and ``sitecustomize.py`` note which of them was imported and the
command line of the process, then ``recovery/`` hands over to the real library, so that
the job runs either way and the notes tell who imported what."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support import BIN, spawn, terminate, tftrun_cmd

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
NOTE = """import pathlib
command = pathlib.Path("/proc/self/cmdline").read_bytes().replace(b"\\0", b" ").decode()
with open({marker!r}, "a") as marker:
    marker.write({what!r} + ": " + command + "\\n")
"""
HAND_OVER = """__path__[:] = [{real!r}]
__file__ = {real!r} + "/__init__.py"
exec(compile(pathlib.Path(__file__).read_text(), __file__, "exec"))
"""


def plant(folder: Path, marker: Path) -> None:
    (folder / "recovery").mkdir(parents=True)
    (folder / "recovery" / "__init__.py").write_text(
        NOTE.format(marker=str(marker), what="recovery") + HAND_OVER.format(real=str(REPO / "recovery")))
    (folder / "sitecustomize.py").write_text(NOTE.format(marker=str(marker), what="sitecustomize"))


@pytest.mark.parametrize("fork_server", [True, False])
def test_a_planted_recovery_runs_in_none_of_tftruns_own_processes(
        tmp_path: Path, fork_server: bool) -> None:
    """With the fork server (or the scheduler and the workers started cold), the scheduler
    and the watchdog. tftrun itself imports no planted ``recovery/`` either;
    ``sitecustomize`` runs as Python starts, before any of tftrun's code, in tftrun, which
    the user started with that ``PYTHONPATH``, and in a worker started cold, as under
    torchrun."""
    work, marker, out = tmp_path / "work", tmp_path / "marker", tmp_path / "out"
    plant(work, marker)
    out.mkdir()
    logs = tmp_path / "logs"
    env = {**os.environ, "PYTHONPATH": f":{REPO}"}
    proc = spawn(tftrun_cmd("--nproc_per_node=2", f"--fork_server={fork_server}",
                            f"--log_dir={logs}", str(BIN / "path_probe.py"), str(out)),
                 cwd=work, env=env)
    try:
        output = "".join(proc.communicate(timeout=120))
    finally:
        terminate(proc)
    assert proc.returncode == 0, output
    importers = _read(marker).splitlines()
    assert [line for line in importers if line.startswith("recovery:")] == [], importers
    assert [line for line in importers
            if "launcher.cli.tftrun" not in line and "path_probe.py" not in line] == [], importers
    for rank in (0, 1):
        probe = json.loads((out / f"path_{rank}.json").read_text())
        assert probe["cwd"] == str(work)
        assert probe["path"][:3] == [str(BIN), str(work), str(REPO)], probe["path"]


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
