"""tftrun's own ``sys.path``: no entry that stands for the working folder, but the folder
tftrun itself was imported from.

``python -m launcher.cli.tftrun`` and ``python -c`` put the working folder first on
``sys.path``, and so does an empty or relative entry of ``PYTHONPATH`` (``PYTHONPATH=:/x``,
which ``$PYTHONPATH:/x`` makes when it was unset), for the ``tftrun`` command too; a
``recovery/`` planted there would be imported by tftrun in place of its library. The
package's ``__init__`` drops those entries before any of its modules imports recovery.
Standard library only: it runs before recovery is looked for.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["without_working_folder"]


def without_working_folder(sys_path: Sequence[str], pythonpath: str, cwd: str,
                           own_root: str) -> list[str]:
    """``sys_path`` without its entries that stand for the working folder ``cwd`` or a folder
    relative to it: a relative entry, ``cwd`` itself, or what a relative entry of
    ``pythonpath`` became. Kept: ``own_root`` (the folder that holds this ``launcher``) and
    the entries ``pythonpath`` gives as absolute paths."""
    given = pythonpath.split(os.pathsep) if pythonpath else []
    kept = {own_root, *(os.path.normpath(entry) for entry in given if os.path.isabs(entry))}
    relative = {os.path.normpath(os.path.join(cwd, entry)) for entry in given
                if not os.path.isabs(entry)}

    def stands_for_working_folder(entry: str) -> bool:
        full = os.path.normpath(os.path.join(cwd, entry))
        return full not in kept and (not os.path.isabs(entry) or full == cwd or full in relative)

    return [entry for entry in sys_path if not stands_for_working_folder(entry)]
