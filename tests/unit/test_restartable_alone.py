"""``@recovery.restartable`` without a scheduler (plain torchrun, or run alone): the
function is called once, as if undecorated."""

from __future__ import annotations

import pytest

import recovery
from recovery import env as names


@pytest.fixture(autouse=True)
def _no_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(names.MS_SCHED_PORT, raising=False)
    monkeypatch.delenv(names.MS_ROLE, raising=False)


def test_without_a_scheduler_the_function_is_called_once_with_its_arguments() -> None:
    calls: list[tuple[int, str]] = []

    @recovery.restartable
    def main(steps: int, name: str = "x") -> int:
        calls.append((steps, name))
        return steps * 2

    assert main(3, name="run") == 6
    assert calls == [(3, "run")]
    assert main.__name__ == "main"


def test_without_a_scheduler_a_collective_error_is_not_retried() -> None:
    calls = []

    @recovery.restartable
    def main() -> None:
        calls.append(1)
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        main()
    assert calls == [1]
