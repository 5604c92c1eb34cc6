"""The simulator drives the five workers on the real servers; every scenario's checks of
the database and the published events must hold."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable

import asyncpg
import pytest
from rich.console import Console

from tests.integration.support import bcw
from workers.demo import run as demo
from workers.demo import stuck
from workers.sim import Check, Simulator
from workers.sim.scenarios import (
    busy,
    clone,
    gateway_loss,
    journal_loss,
    mixed,
    power_on,
    reconnect,
    restart,
)
from workers.tools.explain import HISTORY

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


async def test_restarted_daemons_get_the_commands_their_old_process_held(
    simulator: Make,
) -> None:
    """The seed's crash rules: a new process holds none of the old one's commands, so the
    replay re-sends them (announced command.replayed) and they complete."""
    sim = await simulator(20, 2)
    assert_all_hold(await power_on(sim))
    assert_all_hold(await restart(sim, nodes=5))
    events = await sim.events()
    assert events[("command.replayed", "")] >= 10


async def test_commands_enqueued_inside_reconnects_finish_without_a_second_hello(
    simulator: Make,
) -> None:
    """The seed: "a command enqueued during a reconnect cannot be stranded"."""
    sim = await simulator(20, 2)
    assert_all_hold(await power_on(sim))
    assert_all_hold(await reconnect(sim, nodes=8))


async def test_a_clone_is_quarantined(simulator: Make) -> None:
    sim = await simulator(10, 2)
    assert_all_hold(await power_on(sim))
    assert_all_hold(await clone(sim))
    events = await sim.events()
    assert events[("security.node.quarantined", "duplicate-identity")] == 1
    assert sum(n for (t, _), n in events.items() if t == "security.node.duplicate-session") >= 4


async def test_slow_steps_slow_simulated_time_and_every_gateway_keeps_its_lease(
    simulator: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loaded machine: each step takes 2 wall seconds. At speed 10 simulated time
    must not leap 18 s a step past the gateways' 15 s leases; it runs slower instead."""
    sim = await simulator(10, 2)
    assert_all_hold(await power_on(sim))
    tick = sim.tick

    async def slow_tick() -> None:
        await tick()
        await asyncio.sleep(2.0)

    async def never() -> bool:
        return False

    monkeypatch.setattr(sim, "tick", slow_tick)
    began = sim.clock()
    assert not await sim.run(never, within=3, speed=10)
    assert sim.clock() - began >= 30  # the budget is simulated time, spent in full
    assert all(g.alive for g in sim.gateways)
    assert await sim.connected() == 10
    assert (
        await sim.fetchval("SELECT count(*) FROM node_sessions WHERE disconnect_reason IS NOT NULL")
        == 0
    )


async def test_a_lost_gateway(simulator: Make) -> None:
    sim = await simulator(30, 3)
    assert_all_hold(await power_on(sim))
    assert_all_hold(await gateway_loss(sim))
    events = await sim.events()
    assert events[("node.disconnected", "gateway-lost")] == 10
    assert events[("command.replayed", "")] == 10


async def test_mixed_and_bcw_explain_tells_each_nodes_story(
    simulator: Make, database_url: str
) -> None:
    sim = await simulator(150, 3)
    assert_all_hold(await mixed(sim))

    async def story(node: str) -> list[tuple[str, str, int]]:
        code, out = await bcw(
            "explain", node, "--since", "7d", "--json", BCW_DATABASE_URL=database_url
        )
        assert code == 0, out
        steps = json.loads(out)["timeline"]
        assert all(s["trace_id"] is None or len(s["trace_id"]) == 32 for s in steps)
        return [(s["what"], s["summary"], s["epoch"]) for s in steps]

    def after(steps: list[tuple[str, str, int]], *wanted: tuple[str, str]) -> bool:
        """`wanted` appear in `steps` in this order (others between them). Only one
        worker's steps, or steps one causes the other, are ordered: workers apply a fact
        each in its own time."""
        found = iter(steps)
        return all(any(w[0] == s[0] and w[1] in s[1] for s in found) for w in wanted)

    def epochs(steps: list[tuple[str, str, int]], what: str, text: str) -> set[int]:
        return {s[2] for s in steps if s[0] == what and text in s[1]}

    clone = sim.daemons[0].node_id  # the quarantined clone's identity
    steps = await story(clone)
    assert after(
        steps,
        ("security.node.duplicate-session", "counted"),
        ("security.node.duplicate-session", "quarantined"),
        ("security.node.quarantined", "duplicate-identity"),
        ("node.disconnected", "revoked"),
    ), steps
    lost = await sim.fetchval(
        "SELECT node_id FROM commands WHERE failure_reason = 'journal-lost' ORDER BY node_id LIMIT 1"
    )
    steps = await story(str(lost))
    assert after(steps, ("dispatch", "attempt 1"), ("command.failed", "journal-lost")), steps
    failed_at = epochs(steps, "command.failed", "journal-lost")
    assert failed_at and failed_at <= epochs(steps, "node.connected", "journal changed"), steps
    stranded = await sim.fetchval(
        f"SELECT node_id FROM {HISTORY} WHERE what = 'node.disconnected'"
        " AND detail->>'reason' = 'gateway-lost' ORDER BY node_id LIMIT 1"
    )
    steps = await story(str(stranded))
    assert after(
        steps,
        ("dispatch", "attempt 1"),
        ("node.disconnected", "gateway-lost"),
        ("command.replayed", "attempt 2"),
        ("command.completed", "attempt 2"),
    ), steps
    replayed_at = epochs(steps, "command.replayed", "attempt 2")
    assert replayed_at and replayed_at <= epochs(steps, "node.connected", ""), steps
    dispatches = await sim.fetchval(
        "SELECT count(*) FILTER (WHERE NOT (detail ? 'payload' OR detail ? 'signature'))"
        f"       - count(*) FROM {HISTORY} WHERE what = 'dispatch'"
    )
    assert dispatches == 0  # a command's payload and signature stay in `commands`
    code, table = await bcw("explain", clone, BCW_DATABASE_URL=database_url)
    assert code == 0 and "security.node.quarantined" in table and "revoked" in table


async def test_a_scenario_that_overruns_names_what_everything_waits_for(
    simulator: Make, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bcw demo` gives a scenario `SCENARIO_BUDGET` wall seconds; past it the demo says
    where its tasks wait, what each consumer still has, and which backends wait on what."""
    sim = await simulator(5, 1)
    monkeypatch.setattr(demo, "SCENARIO_BUDGET", 1.0)
    holder = await asyncpg.connect(database_url)
    waiter = await asyncpg.connect(database_url)
    holding = holder.transaction()
    await holding.start()
    await holder.execute("SELECT 1 FROM gateways FOR UPDATE")
    blocked = asyncio.create_task(waiter.execute("BEGIN; LOCK TABLE gateways IN EXCLUSIVE MODE"))

    async def waits_for_the_lock(_sim: Simulator) -> list[Check]:
        await blocked
        return []

    workers = asyncio.create_task(asyncio.Event().wait())  # the workers still run
    console = Console(record=True, width=240)
    try:
        assert await demo._watched(waits_for_the_lock(sim), workers, sim, console) == []
    finally:
        await holding.rollback()
        await stuck.cancel(workers)
        await waiter.close()
        await holder.close()
    text = console.export_text()
    assert "the scenario did not end within 1 s" in text, text
    # where it waits, named from the checkout: a frame of this project, not a library's
    assert "tests/e2e/test_scenarios.py" in text and "waits_for_the_lock" in text, text
    assert re.search(r"^\s+liveness\s+\d+\s+\d+\s+\d+$", text, flags=re.M), text  # its consumer
    assert "Lock:" in text and "LOCK TABLE gateways" in text, text  # the backend and its wait


async def test_workers_that_stop_end_the_demo_with_their_error(simulator: Make) -> None:
    sim = await simulator(5, 1)

    async def stops() -> None:
        raise RuntimeError("the database refused the workers' login")

    workers = asyncio.create_task(stops())
    console = Console(record=True, width=240)
    never = asyncio.Event()

    async def forever(_sim: Simulator) -> list[Check]:
        await never.wait()
        return []

    assert await demo._watched(forever(sim), workers, sim, console) == []
    assert 'the workers stopped before the scenario ended: RuntimeError("the database refused' in (
        console.export_text()
    )
