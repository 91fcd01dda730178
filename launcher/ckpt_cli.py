"""``tftctl ckpt``: list, verify and show checkpoints (filled in by the checkpoints work)."""

from __future__ import annotations

from launcher.cliutil import new_app

app = new_app("ckpt", "Inspect and verify checkpoints.")
