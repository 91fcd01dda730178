"""Scripts written against the flat recovery/ of tftrun 0.1 keep importing (recovery/moved.py)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from recovery.moved import MOVED
from support import REPO


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_is_the_module_at_its_new_path(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    assert importlib.import_module(old) is new
    assert new.__spec__ is not None and new.__spec__.name == MOVED[old]


def test_the_names_the_docs_show_import_from_their_old_paths_in_a_fresh_interpreter() -> None:
    script = (
        "from recovery.elastic import ElasticTrainer\n"
        "from recovery.checkpoint import CheckpointConfig\n"
        "from recovery.control import SchedulerControl\n"
        "import recovery\n"
        "assert recovery.elastic.ElasticTrainer is recovery.ElasticTrainer\n"
        "assert CheckpointConfig is recovery.CheckpointConfig\n"
        "print(ElasticTrainer.__module__, SchedulerControl.__module__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["recovery.train.elastic", "recovery.control.client"]


def test_a_name_the_control_package_never_had_is_an_attribute_error() -> None:
    import recovery.control

    with pytest.raises(AttributeError):
        getattr(recovery.control, "NoSuchThing")
