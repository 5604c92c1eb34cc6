"""No command is stranded by a reconnect (the seed: "a command enqueued during a reconnect
cannot be stranded"), end to end: the fake daemon, the reference gateway and the replay
worker on real servers. The dispatch loop needs only the committed epoch bump, so its
notice for the new epoch can reach the gateway before the session is registered, or before
the daemon has its Welcome. A test hook holds each window open; the notice waits for the
Welcome, and the daemon runs the command once, with no second Hello."""

from __future__ import annotations

import asyncio
import random

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.notices import Dispatch
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.support import eventually, make_settings, running, stream_messages
from workers import replay
from workers.gateway import Gateway
from workers.runtime.store import migrate
from workers.sim.daemon import FakeDaemon


@pytest.mark.parametrize("window", ["committed", "registered"])
async def test_a_dispatch_in_a_reconnects_window_waits_for_the_welcome(
    window: str,
    gateway: Gateway,
    db: asyncpg.Connection,
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
) -> None:
    # its clock is not the fleet's (it proves no Hello): a node without a key, at warn
    await migrate.set_hello_proof(db, "warn")
    await fleet.join(db, "n1", key=False)
    now = [1_000.0]
    daemon = FakeDaemon("n1", "n1-serial", lambda: now[0], random.Random(1), work_seconds=(1, 1))
    settings = make_settings(servers.nats_url, database_url, subjects)
    async with running(settings, [replay.build(settings)]):
        await daemon.tick([gateway])
        assert (daemon.connected, daemon.epoch) == (True, 1)
        inside, go = asyncio.Event(), asyncio.Event()

        async def pause(point: str, node_id: str, epoch: int) -> None:
            if point == window and node_id == "n1":
                inside.set()
                await go.wait()

        gateway.pause = pause
        daemon.crash()  # a new daemon process: it says Hello again at once
        hello = asyncio.create_task(daemon.tick([gateway]))
        await asyncio.wait_for(inside.wait(), 10)
        command = await db.fetchval("SELECT enqueue_command('n1', 'exec', '{}')")

        async def waiting() -> bool:  # the dispatch for epoch 2 reached the gateway, and waits
            opening = gateway.opening.get("n1")
            return opening is not None and any(
                isinstance(n, Dispatch) and n.command_id == command and n.epoch == 2
                for n, _ in opening.held
            )

        await eventually(waiting, what="the dispatch for epoch 2 held by the gateway")
        assert not daemon.running  # nothing before the Welcome
        go.set()
        await asyncio.wait_for(hello, 10)
        assert (daemon.epoch, daemon.welcomes) == (2, 2)

        async def runs() -> bool:
            return command in daemon.running

        await eventually(runs, what="the command on the daemon after its Welcome")
        now[0] += 2
        await daemon.tick([gateway])  # it finishes and reports

        async def done() -> bool:
            return await db.fetchval("SELECT state FROM commands") == "done"

        await eventually(done, what="the command done")
    assert daemon.welcomes == 2  # no further Hello was needed
    row = await db.fetchrow("SELECT session_epoch, delivery_attempt FROM commands")
    assert (row["session_epoch"], row["delivery_attempt"]) == (2, 1)  # sent once, at epoch 2
    assert "n1" not in gateway.opening
    notices = await stream_messages(nc.jetstream(), subjects.gateway_stream)
    assert [m.headers["Bc-Type"] for m in notices].count("dispatch") == 1


async def test_a_notice_held_for_a_hello_that_fails_is_dropped_with_it(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    """A Hello refused after its commit opens no session: what waited for it goes (the
    node's next Hello replays its commands), and nothing of it stays on the gateway."""
    # its clock is not the fleet's (it proves no Hello): a node without a key, at warn
    await migrate.set_hello_proof(db, "warn")
    await fleet.join(db, "n1", key=False)
    daemon = FakeDaemon("n1", "n1-serial", lambda: 1_000.0, random.Random(1))

    async def fail(point: str, node_id: str, epoch: int) -> None:
        if point == "registered":
            raise RuntimeError("the stream broke")

    gateway.pause = fail
    with pytest.raises(RuntimeError):
        await daemon.tick([gateway])
    assert gateway.opening == {}
