"""A reconnect settles before it replays (docs/contract.md, "As of the Hello"), end to
end: the fake daemon, the reference gateway and the replay worker on real servers. A
command that finished while the node was away comes back in the Hello's `results`: it is
done once, never re-sent, never announced replayed; the gateway acks the results right
after the Welcome, then sends the desired state the daemon is behind."""

from __future__ import annotations

import asyncio
import json
import random
import uuid

import asyncpg
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.gateway.hellos import request
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, make_settings, running, stream_messages
from workers import replay
from workers.gateway import Gateway
from workers.gateway.admission import DesiredState
from workers.runtime.store import migrate
from workers.sim.daemon import FakeDaemon

SPEC = {"sysctl": {"vm.swappiness": 10}}


async def _state(db: asyncpg.Connection) -> str | None:
    return await db.fetchval("SELECT state FROM commands")  # type: ignore[no-any-return]


async def test_a_reconnect_settles_what_finished_while_away_before_its_replay(
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
    assert await db.fetchval("SELECT set_node_spec('n1', $1::jsonb)", json.dumps(SPEC)) == 1
    now = [1_000.0]
    daemon = FakeDaemon("n1", "n1-serial", lambda: now[0], random.Random(1), work_seconds=(5, 5))
    settings = make_settings(servers.nats_url, database_url, subjects)
    async with running(settings, [replay.build(settings)]):
        await daemon.tick([gateway])  # Hello → Welcome, then its desired state (it has none)
        await eventually(lambda: _applied(daemon, 1), what="the desired state of generation 1")
        command = await db.fetchval("SELECT enqueue_command('n1', 'exec', '{}')")
        await eventually(lambda: _running(daemon, command), what="the command on the daemon")
        await eventually(lambda: _is(db, "running"), what="its progress applied")
        # the node goes away; the command finishes meanwhile; the spec moves on
        await gateway.disconnect("n1", daemon.epoch)
        daemon.drop("stream closed")
        daemon.partitioned = True
        now[0] += 6
        await daemon.tick([gateway])
        assert list(daemon.results) == [command]
        assert await db.fetchval("SELECT set_node_spec('n1', $1::jsonb)", json.dumps(SPEC)) == 2
        # it comes back: its Hello carries the result
        daemon.partitioned = False
        now[0] += 120
        await daemon.tick([gateway])
        assert daemon.connected
        await eventually(lambda: _applied(daemon, 2), what="the desired state of generation 2")
        assert daemon.results == {}  # acked: forgotten
        kinds = [e["kind"] for e in daemon.journal]
        assert kinds.index("results.acked") < len(kinds) - 1
        assert kinds[kinds.index("results.acked") + 1] == "desired-state.applied"
        await eventually(lambda: _is(db, "done"), what="the command done by the Hello's result")
        await asyncio.sleep(0.5)  # anything the replay would wrongly send has been sent
    events = await stream_messages(nc.jetstream(), subjects.events_stream)
    kinds_of_events = [m.headers["Bc-Type"] for m in events]
    assert kinds_of_events.count("command.completed") == 1
    assert "command.replayed" not in kinds_of_events
    notices = await stream_messages(nc.jetstream(), subjects.gateway_stream)
    assert [m.headers["Bc-Type"] for m in notices].count("dispatch") == 1  # never re-sent
    assert await db.fetchval("SELECT delivery_attempt FROM commands") == 1


async def _applied(daemon: FakeDaemon, generation: int) -> bool:
    return daemon.generation == generation and daemon.spec_hash is not None


async def _running(daemon: FakeDaemon, command: object) -> bool:
    return command in daemon.running


async def _is(db: asyncpg.Connection, state: str) -> bool:
    return await _state(db) == state


async def test_the_desired_state_goes_out_as_its_signed_bytes_after_the_welcome_and_the_ack(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    """A spec set as bytes (`set_node_spec_bytes`) is relayed verbatim — key order and
    spacing as signed, which `jsonb` would not keep — and follows the Welcome and the Ack
    of the Hello's results, in that order, from the next turn of the event loop."""
    await fleet.join(db, "n1")
    body = '{"z": 1,   "a": {"y": [3, 2, 1], "b": "x"}}'
    assert await db.fetchval("SELECT set_node_spec_bytes('n1', $1, 'sig-1')", body) == 1
    stream = RecordingStream()
    done = {"command_id": str(uuid.uuid4()), "outcome": "done", "result": {}, "error": None}
    welcome = await fleet.say_hello(gateway, request(results=[done]), stream)
    assert welcome.epoch == 1 and stream.followed == []  # nothing before the Welcome is taken
    await asyncio.sleep(0.05)
    assert [kind for kind, _ in stream.followed] == ["ack", "desired"]
    desired = stream.followed[1][1]
    assert isinstance(desired, DesiredState)
    assert (desired.body, desired.signature, desired.generation) == (body, "sig-1", 1)
    assert desired.spec == json.loads(body)
    # a spec set as JSON afterwards has no bytes of its own: its JSON view's text goes out
    assert await db.fetchval("SELECT set_node_spec('n1', $1::jsonb)", json.dumps(SPEC)) == 2
    again = RecordingStream()
    await fleet.say_hello(gateway, request(boot_id="b2"), again)
    await asyncio.sleep(0.05)
    [(kind, state)] = again.followed
    assert kind == "desired" and json.loads(state.body) == SPEC and state.signature is None
