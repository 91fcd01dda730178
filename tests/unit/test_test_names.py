"""pytest imports test modules by their basename (no ``__init__.py`` in tests/): two test
files of one name in tests/unit and tests/integration make the second one fail to collect."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_basename_of_its_own() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
