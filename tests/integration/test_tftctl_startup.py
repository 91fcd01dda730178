"""tftctl's commands but ``ckpt`` start without importing torch, seconds of CPU on a busy
machine: ``tftctl status`` and ``tftctl inject`` talk to the scheduler through
recovery/control/tcpstore_client.py, as tftrun does."""

from __future__ import annotations

import subprocess
import sys


def test_tftctl_imports_torch_only_for_a_ckpt_command() -> None:
    code = "import sys\nfrom launcher.cli import tftctl\nprint('torch' in sys.modules)"
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout
    assert said == "False\n"
