"""torchrun's recommended entry point: ``@record`` on main. Rank 1 raises
``ValueError("boom from rank 1")`` in launches listed in argv[1] (e.g. ``0`` or ``0,1``, by
TORCHELASTIC_RESTART_COUNT); in any other launch it exits 3 without raising."""

import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    if os.environ["RANK"] != "1":
        return
    if os.environ["TORCHELASTIC_RESTART_COUNT"] in sys.argv[1].split(","):
        raise ValueError("boom from rank 1")
    sys.exit(3)


if __name__ == "__main__":
    main()
