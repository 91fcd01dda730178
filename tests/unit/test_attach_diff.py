"""The adoption of ``recovery.attach`` stays small: the CPU port of pytorch/examples' DDP
tutorial (tests/bin/ddp_tutorial.py) and the same script under ``recovery.attach``
(tests/bin/ddp_tutorial_attached.py, which tests/integration/test_attach.py runs) differ
by at most 10 lines, and docs/quickstart-own-script.md shows exactly those changes."""

from __future__ import annotations

import difflib
import re

from support import BIN, REPO

MOST_CHANGED_LINES = 10


def _changes(old: str, new: str) -> list[str]:
    """The removed and added lines of a unified diff (``-line``/``+line``), blank ones left out."""
    diff = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and line[:3] not in ("---", "+++")
            and line[1:].strip()]


def _port_changes() -> list[str]:
    return _changes((BIN / "ddp_tutorial.py").read_text(),
                    (BIN / "ddp_tutorial_attached.py").read_text())


def test_the_tutorial_changes_by_at_most_ten_lines() -> None:
    changes = _port_changes()
    assert 0 < len(changes) <= MOST_CHANGED_LINES, changes


def test_the_quickstart_shows_the_same_changes() -> None:
    """The docs' diff is against the original script (``nccl``); the port uses ``gloo``."""
    text = (REPO / "docs" / "quickstart-own-script.md").read_text()
    block = re.search(r"## 1\. Keep your loop.*?```diff\n(.*?)```", text, re.DOTALL)
    assert block is not None
    shown = sorted(line[0] + line[1:].strip() for line in block[1].splitlines()
                   if line[:1] in "+-" and line[1:].strip())
    ported = sorted(line[0] + line[1:].strip().replace('"gloo"', '"nccl"')
                    for line in _port_changes())
    # The original imports its two functions in the other order, and builds DDP on its GPU.
    assert [line.replace("destroy_process_group, init_process_group",
                         "init_process_group, destroy_process_group") for line in ported] == shown
