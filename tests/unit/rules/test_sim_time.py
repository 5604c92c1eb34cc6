"""How fast the simulator moves time (`workers.sim.simulator.leap`): as fast as asked,
but never a leap a gateway's lease could not survive."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workers.gateway import GatewaySettings
from workers.sim.simulator import MAX_LEAP, leap

steps = st.floats(min_value=0.0, max_value=600.0, allow_nan=False)
speeds = st.floats(min_value=1.0, max_value=100.0, allow_nan=False)


@given(steps, speeds)
def test_a_step_never_leaps_more_than_the_bound(step: float, speed: float) -> None:
    assert 0.0 <= leap(step, speed) <= MAX_LEAP


@given(st.floats(min_value=0.0, max_value=0.3), st.floats(min_value=1.0, max_value=10.0))
def test_a_quick_step_runs_at_the_asked_speed(step: float, speed: float) -> None:
    assert leap(step, speed) == (speed - 1.0) * step  # the wall clock adds `step` itself


@given(speeds, speeds)
def test_a_slower_step_never_leaps_less(speed: float, other: float) -> None:
    assert leap(0.5, speed) <= leap(0.5, max(speed, other))
    assert leap(0.1, speed) <= leap(0.2, speed)


def test_renewals_survive_the_largest_leap_on_top_of_a_slow_step() -> None:
    settings = GatewaySettings()
    # a lease renewed when due, then one leap and a step of up to 5 wall seconds: still held
    assert settings.renew_every + MAX_LEAP + 5.0 < settings.lease_ttl
