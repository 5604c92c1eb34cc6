"""The simulator drives the five workers on the real servers; every scenario's checks of
the database and the published events must hold."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from workers.sim import Check, Simulator
from workers.sim.scenarios import busy, clone, gateway_loss, journal_loss, mixed, power_on

pytestmark = pytest.mark.slow

Make = Callable[[int, int], Awaitable[Simulator]]


def assert_all_hold(checks: list[Check]) -> None:
    failed = [f"{c.name}: expected {c.expected}, got {c.actual}" for c in checks if not c.ok]
    assert not failed, "\n".join(failed)


async def test_power_on_herd_is_pushed_back_and_all_connect(simulator: Make) -> None:
    sim = await simulator(300, 1)  # more than one gateway's 200/s bucket at once
    checks = await power_on(sim)
    assert_all_hold(checks)
    assert sum(d.refusals["RESOURCE_EXHAUSTED"] for d in sim.daemons) > 0
    assert all(d.welcomes >= 1 for d in sim.daemons)


async def test_busy_daemons_back_off_and_finish(simulator: Make) -> None:
    sim = await simulator(20, 2)
    assert_all_hold(await power_on(sim))
    assert_all_hold(await busy(sim, nodes=5, per_node=5))


async def test_journal_loss_fails_in_flight_commands(simulator: Make) -> None:
    sim = await simulator(20, 2)
    assert_all_hold(await power_on(sim))
    assert_all_hold(await journal_loss(sim, nodes=5))


async def test_a_clone_is_quarantined(simulator: Make) -> None:
    sim = await simulator(10, 2)
    assert_all_hold(await power_on(sim))
    assert_all_hold(await clone(sim))
    events = await sim.events()
    assert events[("security.node.quarantined", "duplicate-identity")] == 1
    assert sum(n for (t, _), n in events.items() if t == "security.node.duplicate-session") >= 4


async def test_a_lost_gateway(simulator: Make) -> None:
    sim = await simulator(30, 3)
    assert_all_hold(await power_on(sim))
    assert_all_hold(await gateway_loss(sim))
    events = await sim.events()
    assert events[("node.disconnected", "gateway-lost")] == 10
    assert events[("command.replayed", "")] == 10


async def test_mixed(simulator: Make) -> None:
    assert_all_hold(await mixed(await simulator(150, 3)))
