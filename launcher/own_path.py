"""tftrun's own ``sys.path``: no entry that stands for the working folder, but the folder tftrun was imported from.

``python -m``, ``-c`` and an empty or relative ``PYTHONPATH`` entry put the working folder on ``sys.path``, where
a planted ``recovery/`` would replace tftrun's library. Standard library only: it runs before recovery is found.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["without_working_folder"]


def without_working_folder(sys_path: Sequence[str], pythonpath: str, cwd: str,
                           own_root: str) -> list[str]:
    """``sys_path`` without the entries that stand for ``cwd`` or a folder relative to it; ``own_root`` (the
    folder holding this ``launcher``) and ``pythonpath``'s absolute entries are kept."""
    given = pythonpath.split(os.pathsep) if pythonpath else []
    kept = {own_root, *(os.path.normpath(entry) for entry in given if os.path.isabs(entry))}
    relative = {os.path.normpath(os.path.join(cwd, entry)) for entry in given
                if not os.path.isabs(entry)}

    def stands_for_working_folder(entry: str) -> bool:
        full = os.path.normpath(os.path.join(cwd, entry))
        return full not in kept and (not os.path.isabs(entry) or full == cwd or full in relative)

    return [entry for entry in sys_path if not stands_for_working_folder(entry)]
