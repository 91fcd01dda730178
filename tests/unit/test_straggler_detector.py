"""The straggler detector: a slow rank named within its window, a jittery healthy job never."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.control.stragglers import StepTimes, StragglerDetector, StragglerSettings, merge_summaries

RANKS = st.integers(min_value=2, max_value=16)
BASE = st.floats(min_value=1e-4, max_value=10.0)


def _jittered(rng: random.Random, base: float, jitter: float) -> float:
    return base * (1 + rng.uniform(-jitter, jitter))


@settings(max_examples=200, deadline=None)
@given(ranks=RANKS, base=BASE, seed=st.integers(0, 2**32 - 1),
       steps_per_beat=st.integers(1, 5), beats=st.integers(1, 60))
def test_no_rank_is_named_under_30_percent_jitter(ranks: int, base: float, seed: int,
                                                  steps_per_beat: int, beats: int) -> None:
    """Every rank's step times drawn independently within +-30 % of one base: with the
    defaults (1.5x for 20 steps) none is a straggler."""
    rng = random.Random(seed)
    detector = StragglerDetector(StragglerSettings())
    step = 0
    for _beat in range(beats):
        step += steps_per_beat
        for rank in rng.sample(range(ranks), ranks):
            times = sorted(_jittered(rng, base, 0.3) for _ in range(steps_per_beat))
            assert detector.heard(rank, step, times[len(times) // 2], steps_per_beat) is None
    assert detector.named == {}


@settings(max_examples=200, deadline=None)
@given(ranks=RANKS, base=BASE, seed=st.integers(0, 2**32 - 1),
       slowdown=st.floats(min_value=1.5, max_value=20.0), window=st.integers(1, 40),
       healthy_steps=st.integers(0, 30))
def test_a_rank_slower_than_every_peer_by_the_factor_is_named_within_the_window(
        ranks: int, base: float, seed: int, slowdown: float, window: int,
        healthy_steps: int) -> None:
    """From a step on, one rank takes ``slowdown`` >= 1.5 times its slowest peer's time,
    each step, while the peers jitter by +-10 %. At the default factor it is named exactly
    at the window's last step, with the step it slowed down at, and only it is."""
    rng = random.Random(seed)
    slow = rng.randrange(ranks)
    detector = StragglerDetector(StragglerSettings(window=window))
    named = []
    for step in range(1, healthy_steps + window + 1):
        peers = {rank: _jittered(rng, base, 0.1) for rank in range(ranks) if rank != slow}
        for rank, time in peers.items():
            assert detector.heard(rank, step, time, 1) is None
        slowed = step > healthy_steps
        time = slowdown * max(peers.values()) if slowed else _jittered(rng, base, 0.1)
        if (found := detector.heard(slow, step, time, 1)) is not None:
            named.append((step, found))
    assert len(named) == 1
    step, found = named[0]
    assert step == healthy_steps + window
    assert (found.rank, found.since) == (slow, healthy_steps + 1)
    assert found.step_time >= 1.5 * found.median
    assert set(detector.named) == {slow}


def test_a_named_rank_back_under_the_threshold_is_cleared_and_named_again_later() -> None:
    detector = StragglerDetector(StragglerSettings(factor=1.5, window=4))
    detector.heard(0, 10, 1.0, 10)
    assert detector.heard(1, 10, 2.0, 4) is not None
    assert detector.heard(1, 12, 2.0, 2) is None  # named once
    assert detector.heard(1, 14, 1.0, 2) is None
    assert detector.named == {}
    found = detector.heard(1, 20, 3.0, 5)
    assert found is not None and found.since == 16


def test_a_lone_rank_and_a_forgotten_one_are_never_named() -> None:
    detector = StragglerDetector(StragglerSettings(window=1))
    assert detector.heard(0, 5, 9.0, 5) is None
    detector.heard(1, 5, 1.0, 5)
    detector.forget(1)
    assert detector.heard(0, 6, 9.0, 1) is None


@pytest.mark.parametrize(("factor", "window", "problem"), [
    (1.0, 20, "--straggler_factor must be above 1, got 1"),
    (float("nan"), 20, "--straggler_factor must be above 1, got nan"),
    (1.5, 0, "--straggler_window must be at least 1 step, got 0"),
])
def test_bad_settings_are_refused(factor: float, window: int, problem: str) -> None:
    assert StragglerSettings(factor, window).problem() == problem


def test_settings_travel_through_the_environment() -> None:
    chosen = StragglerSettings(2.5, 7)
    assert StragglerSettings.from_env(chosen.to_env()) == chosen
    assert StragglerSettings.from_env({}) == StragglerSettings()


def test_step_times_are_summed_up_once_per_beat_past_the_warm_up() -> None:
    times = StepTimes()
    assert [times.add(9.0) for _ in range(20)] == [False] * 20  # the warm-up: never sent
    assert times.take() is None
    for seconds in (0.003, 0.001, 0.002):
        times.add(seconds)
    assert times.take() == (2000, 3, False)
    assert [times.add(0.002) for _ in range(17)] == [False] * 16 + [True]
    assert times.take() == (2000, 17, True)
    assert times.take() is None


@settings(max_examples=200, deadline=None)
@given(pace=st.floats(1e-4, 10.0), steady=st.lists(st.floats(0.8, 1.19), min_size=60, max_size=100),
       slow=st.lists(st.floats(1.8, 50.0), min_size=11, max_size=11), beats=st.sets(st.integers(0, 110)))
def test_a_rank_whose_own_pace_drops_says_so_at_once_with_its_last_window(
        pace: float, steady: list[float], slow: list[float], beats: set[int]) -> None:
    """The defaults (1.5x, a window of 20), whenever its beats take the summaries: past
    the rank's 20 steps of warm-up, its 40th step goes out at once, and so does the slow step that turns the median of
    its last 20 steps 1.5x that of the 20 before, with those 20 steps alone (a median with
    the faster ones before them would hide the slow-down from the scheduler, which
    compares with the peers, until a later beat: 6 to 12 s with the defaults)."""
    times = StepTimes()
    for step, share in enumerate(steady):
        assert times.add(pace * share) is (step == 39)  # its first pace goes out at once
        if step in beats:
            times.take()
    found = [times.add(pace * share) for share in slow[:10]]
    if not found[-1]:  # the median of 20 is their middle two's mean: the 10th slow step or the 11th
        found.append(times.add(pace * slow[10]))
    assert found == [False] * (len(found) - 1) + [True]
    median, count, urgent = times.take()
    assert (count, urgent) == (20, True)
    assert median >= round(1.5 * min(steady) * pace * 1e6) - 1
    assert times.add(pace * slow[-1]) is False  # the slow pace is its own now


def test_a_pace_that_turns_faster_is_sent_at_once_too() -> None:
    """A first summary taken in a slow start is the peers' reference: a rank that then
    runs 1.5x faster says so at once, or a peer's slow-down would be compared with it
    (in CI a straggler was named 6 s late, at the peers' next beats)."""
    times = StepTimes(StragglerSettings(factor=2.0, window=3))
    assert [times.add(t) for t in (9.0, 9.0, 9.0, 3.0, 3.0, 3.0)] == [False] * 5 + [True]
    assert times.take() == (3_000_000, 3, True)
    assert [times.add(t) for t in (1.6, 1.6, 1.6)] == [False] * 3  # under 2x faster
    assert [times.add(t) for t in (0.5, 0.5)] == [False, True]
    assert times.take() == (500_000, 3, True)


def test_a_noisy_slow_down_is_found_by_the_medians_and_a_noisy_pace_is_not() -> None:
    """Under load a slowed rank's steps are not all slow: medians, not a run in a row."""
    times = StepTimes(StragglerSettings(factor=2.0, window=3))
    assert [times.add(t) for t in (5.0, 5.0, 5.0)] == [False] * 3  # its warm-up
    assert [times.add(t) for t in (1.0, 3.0, 1.0, 1.0, 0.2, 1.0)] == [False, False, True] + [False] * 3
    assert times.take() == (1_000_000, 6, True)
    assert [times.add(t) for t in (2.0, 0.5, 2.5)] == [False, False, True]
    assert times.take() == (2_000_000, 3, True)


def test_a_supervisor_merges_two_beats_of_a_rank_into_one_summary() -> None:
    assert merge_summaries(None, (5, 2)) == (5, 2)
    assert merge_summaries((5, 2), (9, 3)) == (9, 5)
    assert merge_summaries((5, 4), (9, 3)) == (5, 7)


def test_a_first_summary_is_its_peers_reference_and_never_named() -> None:
    """A process's first summary holds its warm-up: not named, however slow, yet its
    peers are compared with it at once (with 6 s beats, a beat sooner)."""
    detector = StragglerDetector(StragglerSettings())
    detector.warming_up(0, 0.010)
    detector.warming_up(1, 0.011)
    detector.warming_up(2, 0.500)
    assert detector.named == {}
    named = detector.heard(2, 120, 0.030, 20)
    assert named is not None and (named.rank, named.since) == (2, 101)
    assert named.median == pytest.approx(0.0105)
