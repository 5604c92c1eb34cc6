"""How fast the simulator moves time (`workers.sim.simulator.leap`): as fast as asked,
but never a leap a gateway's lease could not survive."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.subjects import Subjects
from workers.gateway import GatewaySettings
from workers.sim import simulator
from workers.sim.simulator import GATEWAY_TICK, MAX_LEAP, leap

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
    # a lease renewed when due, then one leap, and the gateways ticked again within
    # GATEWAY_TICK however long the step's daemons take (5 s of lateness to spare)
    assert settings.renew_every + MAX_LEAP + GATEWAY_TICK + 5.0 < settings.lease_ttl


class _Gateway:
    def __init__(self) -> None:
        self.ticks = 0

    async def tick(self) -> None:
        self.ticks += 1


class _SlowDaemon:
    """A daemon whose step takes `seconds` (a herd's Hellos on a loaded machine)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def now(self) -> float:
        return 0.0

    def idle(self, now: float) -> bool:
        return False

    async def tick(self, gateways: object) -> None:
        await asyncio.sleep(self.seconds)


async def test_a_slow_step_ticks_the_gateways_while_its_daemons_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(simulator, "GATEWAY_TICK", 0.05)
    sim = simulator.Simulator(None, None, Subjects("t"), nodes=0, gateways=0)  # type: ignore[arg-type]
    gateway = _Gateway()
    sim.gateways = [gateway]  # type: ignore[list-item]
    sim.daemons = [_SlowDaemon(0.6)]  # type: ignore[list-item]
    await sim.tick()
    assert gateway.ticks >= 3  # once at the start, then every 0.05 s of the 0.6 s
    sim.daemons = [_SlowDaemon(0.0)]  # type: ignore[list-item]
    before = gateway.ticks
    await sim.tick()
    assert gateway.ticks == before + 1  # a quick step: once
