"""The timeouts a worker or the scheduler reads from the env contract: a value that is not
a finite number of seconds is refused by name, never taken (a NaN timeout compares false
with everything, so a frozen worker would never be judged)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recovery import env as names
from recovery.timeouts import Timeouts

TIMEOUT_VARS = [names.TFT_REJOIN_COOLDOWN, names.TFT_CLUSTER_TIME_OUT,
                names.TFT_HEARTBEAT_TIMEOUT, names.TFT_PROGRESS_TIMEOUT]


@pytest.mark.parametrize("name", TIMEOUT_VARS)
@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "soon"])
def test_a_value_that_is_not_a_finite_number_is_refused_by_name(name: str, raw: str) -> None:
    with pytest.raises(ValueError, match=name):
        Timeouts.from_env({name: raw})


@given(seconds=st.floats(min_value=0.001, max_value=1e6))
def test_a_finite_positive_value_is_read_as_given(seconds: float) -> None:
    timeouts = Timeouts.from_env({names.TFT_HEARTBEAT_TIMEOUT: repr(seconds)})
    assert timeouts.heartbeat_timeout == seconds
    assert 0 < timeouts.heartbeat_interval <= seconds / 5
