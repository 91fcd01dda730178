"""The size limits the project keeps: no module of launcher/ over 450 lines, none of
recovery/ over 600 (docs/architecture.md), and docs/benchmarks.md under 250."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMITS = {"launcher": 450, "recovery": 600}


@pytest.mark.parametrize("package", sorted(LIMITS))
def test_no_module_is_over_its_packages_limit(package: str) -> None:
    limit = LIMITS[package]
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
             for path in (ROOT / package).rglob("*.py")}
    assert sizes, package
    assert {name: lines for name, lines in sizes.items() if lines > limit} == {}


def test_the_benchmarks_page_stays_under_250_lines() -> None:
    assert len((ROOT / "docs" / "benchmarks.md").read_text().splitlines()) < 250
