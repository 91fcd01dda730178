"""Write this worker's ``sys.path`` and working folder to ``OUT/path_<RANK>.json``:
``python path_probe.py OUT``. It imports nothing of tftrun's."""

import json
import os
import sys
from pathlib import Path

Path(sys.argv[1], f"path_{os.environ['RANK']}.json").write_text(
    json.dumps({"path": sys.path, "cwd": os.getcwd()}))
