"""tftrun's launcher. Imported first, before any of its modules imports recovery: it drops
the working folder from ``sys.path`` (launcher/own_path.py)."""

import os
import sys

from launcher.own_path import without_working_folder

sys.path[:] = without_working_folder(sys.path, os.environ.get("PYTHONPATH", ""), os.getcwd(),
                                     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
