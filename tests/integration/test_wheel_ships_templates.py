"""The wheel pip builds from the repository ships ``tftctl new``'s templates."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from support import REPO


def test_the_wheel_ships_the_templates(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(REPO)], check=True, timeout=120,
                   capture_output=True)
    (wheel,) = tmp_path.glob("tftrun-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "launcher/templates/mnist/train.py" in names
    assert {"launcher/templates/slurm/tftrun.sbatch", "launcher/templates/k8s/tftrun-job.yaml"} <= names
    assert "launcher/cli/tftrun.py" in names and "recovery/env.py" in names
