"""The phase-overhead bench: what its variants report, and how it compares them."""

from __future__ import annotations

import sys

import pytest

from support import REPO

sys.path.insert(0, str(REPO / "bench"))
from jobs.phase_steps import VARIANTS, WARMUP_STEPS, PhaseBench  # noqa: E402 - bench/ is not a package
from phase_overhead import paired_ratios, report  # noqa: E402

from recovery.train.phase import COMPUTING, DONE, UPDATING  # noqa: E402


def test_only_the_wrapped_variant_reports_phases_and_every_variant_trains() -> None:
    seen: list[str] = []
    exchanged: list[str] = []
    bench = PhaseBench(seen.append, lambda model: exchanged.append("x"))
    plain, wrapped, plain_again = bench.variants
    before = [p.detach().clone() for p in bench.model.parameters()]
    bench.seconds_per_step(plain, steps=1)
    bench.seconds_per_step(plain_again, steps=1)
    assert seen == []
    bench.seconds_per_step(wrapped, steps=2)
    assert seen == [COMPUTING, UPDATING, DONE] * (WARMUP_STEPS + 2)
    assert len(exchanged) == 3 * WARMUP_STEPS + 4
    assert all(not p.equal(b) for p, b in zip(bench.model.parameters(), before))


def test_rounds_time_every_variant_once_per_round() -> None:
    times = PhaseBench(lambda phase: None, lambda model: None).rounds(rounds=2, steps=1)
    assert list(times) == list(VARIANTS)
    assert all(len(values) == 2 and all(v > 0 for v in values) for values in times.values())


def test_ratios_pair_each_round_with_the_plain_time_of_the_same_round() -> None:
    times = {"plain": [1.0, 2.0, 4.0], "wrapped": [1.1, 2.0, 3.6], "plain again": [1.0, 2.2, 4.0]}
    assert paired_ratios(times, "wrapped") == pytest.approx([1.1, 1.0, 0.9])
    title, header, plain, wrapped, plain_again = report("t", times)
    assert header.split()[:3] == ["variant", "median", "ms"]
    assert plain.split() == ["plain", "2000.000", "1000.000"]
    # median of the rounds' ratios, lowest, highest, and best wrapped / best plain
    assert wrapped.split()[-5:] == ["1100.000", "1.0000", "0.9000", "1.1000", "1.1000"]
    assert plain_again.split()[-4:] == ["1.0000", "1.0000", "1.1000", "1.0000"]
