"""Clones refused in time: a session whose Hello was a duplicate identity gets nothing
until the quarantine enforcer has counted it; the quarantined clone never gets a command,
and its revocation closes it — proven clones through one gateway as through two. A
quarantine held for an operator (unproven alternations through one gateway) holds every
session of its node, until an operator dismisses or releases it.

What is real: nats-server, PostgreSQL, two reference gateways, the liveness, quarantine
and replay workers on the real runtime; two "machines" sharing one certificate say Hello
in turn, each while the other's session is live.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, make_settings, running, stream_messages
from workers import liveness, quarantine, replay
from workers.cli.main import main
from workers.gateway import Code, GatewaySettings, HelloRequest, Refused
from workers.runtime.bus import streams
from workers.runtime.store import migrate
from workers.tools import explain


@pytest.mark.parametrize(
    ("serial", "through"),
    [("n1-serial", ("gw-a", "gw-b")), ("unrecorded", ("gw-a", "gw-b")), ("n1-serial", ("gw-a",))],
    ids=["two-gateways", "unrecorded", "one-gateway"],
)
async def test_the_quarantined_clone_gets_no_command(
    serial: str,
    through: tuple[str, ...],
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    pool: asyncpg.Pool,
) -> None:
    await streams.provision_streams(nc.jetstream(), subjects)
    await fleet.join(db, "n1")
    settings = make_settings(servers.nats_url, database_url, subjects)
    workers = [build(settings) for build in (liveness.build, quarantine.build, replay.build)]
    # two machines proving their Hellos by one key (a cloned disk): whatever gateways they
    # dial — one alone cannot make up a proven Hello of another boot — the fourth
    # alternation revokes
    started = [Provisioned(g, pool, nc, subjects) for g in through]
    for gateway in started:
        await gateway.start()
    gateways = [started[0], started[-1]]  # by turns
    try:
        async with running(settings, workers):

            async def hello(turn: int, stream: RecordingStream | None = None) -> RecordingStream:
                stream = stream or RecordingStream()
                request = HelloRequest(
                    node_id="n1",
                    cert_serial=serial,
                    role="worker",
                    boot_id=f"machine-{turn % 2}",
                    journal_id="j1",
                )
                await fleet.say_hello(gateways[turn % 2], request, stream)
                return stream

            await hello(0)
            for turn in range(1, 4):  # three alternations: counted, not quarantined
                stream = await hello(turn)
                await eventually(lambda: _released(db), what=f"alternation {turn} counted")
            command = await db.fetchval("SELECT enqueue_command('n1', 'noop', '{}')")
            await eventually(lambda: _delivered(stream), what="a counted session gets its work")
            assert [d.command_id for d in stream.delivered] == [command]

            # the fourth alternation: quarantined. The gateway waits for the verdict, and
            # the Hello is refused once the revocation has committed (the seed's words)
            clone = RecordingStream()
            with pytest.raises(Refused) as refused:
                await hello(4, clone)
            assert refused.value.code is Code.UNAUTHENTICATED
            assert refused.value.reason == "certificate quarantined: duplicate identity"
            assert await _revoked(db, serial)
            await asyncio.sleep(1.0)  # a dispatch round or two, had it been sent anything
            assert clone.delivered == [] and clone.dropped == ["revoked"]
            row = await db.fetchrow("SELECT session_epoch, held_epoch FROM node_sessions")
            assert row["held_epoch"] == row["session_epoch"] == 5
            state = await db.fetchval("SELECT state FROM commands WHERE command_id = $1", command)
            assert state == "pending"  # taken back from the clone, waiting for a real session
            with pytest.raises(Refused) as refused:  # the serial is refused from now on
                await hello(5)
            assert refused.value.code is Code.UNAUTHENTICATED
            # a serial with no record was admitted, and is now recorded revoked
            assert await db.fetchval(
                "SELECT count(*) FROM node_certs WHERE revoked_at IS NULL"
            ) == (1 if serial == "unrecorded" else 0)
            # the node's DuplicateIdentity condition, as readers see it
            condition = await db.fetchrow("SELECT condition, epoch FROM node_conditions")
            assert tuple(condition) == ("DuplicateIdentity", 5)
            state = await db.fetchrow(explain.SESSION, "n1")
            assert explain.state_fields(state)["conditions"] == ["DuplicateIdentity"]  # type: ignore[index]
            assert "condition DuplicateIdentity" in explain.state_line(state)
            # re-joined with a new certificate, one machine says Hello: the condition clears
            await fleet.join(db, "n1", serial="n1-serial-2")
            await fleet.say_hello(
                gateways[0],
                HelloRequest(
                    node_id="n1",
                    cert_serial="n1-serial-2",
                    role="worker",
                    boot_id="machine-new",
                    journal_id="j1",
                ),
            )

            async def cleared() -> bool:
                return await db.fetchval("SELECT count(*) FROM node_conditions") == 0

            await eventually(cleared, what="the condition cleared by the quarantine worker")
    finally:
        for gateway in started:
            if gateway.alive:
                await gateway.stop(graceful=False)


async def _released(db: asyncpg.Connection) -> bool:
    return await db.fetchval("SELECT held_epoch IS NULL FROM node_sessions") is True


async def _delivered(stream: RecordingStream) -> bool:
    return bool(stream.delivered)


async def _revoked(db: asyncpg.Connection, serial: str) -> bool:
    query = "SELECT revoked_at IS NOT NULL FROM node_certs WHERE serial = $1"
    return bool(await db.fetchval(query, serial))


async def _dropped(stream: RecordingStream) -> bool:
    return bool(stream.dropped)


async def test_with_the_quarantine_down_a_duplicates_hello_is_welcomed_held_after_the_wait(
    nc: NATS, subjects: Subjects, db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    """No verdict comes (the quarantine worker is down): the Hello waits `verdict_wait`,
    then is welcomed, its session held — the hold bound rules from there."""
    await streams.provision_streams(nc.jetstream(), subjects)
    await fleet.join(db, "n1")
    gateway = Provisioned("gw-a", pool, nc, subjects, settings=GatewaySettings(verdict_wait=0.5))
    await gateway.start()
    try:
        first = HelloRequest(
            node_id="n1",
            cert_serial="n1-serial",
            role="worker",
            boot_id="machine-0",
            journal_id="j1",
        )
        await fleet.say_hello(gateway, first)
        started = asyncio.get_running_loop().time()
        welcome = await fleet.say_hello(gateway, replace(first, boot_id="machine-1"))
        waited = asyncio.get_running_loop().time() - started
        assert welcome.epoch == 2 and 0.5 <= waited < 3.0
        assert await db.fetchval("SELECT held_epoch FROM node_sessions") == 2
    finally:
        await gateway.stop(graceful=False)


async def test_a_quarantine_held_for_an_operator_holds_every_session_of_its_node(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    pool: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node without a Hello key, at `warn`: its two machines alternate through gw-a alone
    (which could have made both up), so the fourth alternation is held for an operator.
    From the first counted one the node carries DuplicateIdentity. The alternations after
    it start a new window, each counted and its own hold released — and still no session
    of the node gets the command waiting, each event saying it is held; dismissed by an
    operator (judged no clone), the node's session gets it, nothing revoked."""
    await migrate.set_hello_proof(db, "warn")
    await streams.provision_streams(nc.jetstream(), subjects)
    await fleet.join(db, "n1", key=False)
    settings = make_settings(servers.nats_url, database_url, subjects)
    workers = [build(settings) for build in (liveness.build, quarantine.build, replay.build)]
    gateway = Provisioned("gw-a", pool, nc, subjects, settings=GatewaySettings(verdict_wait=0.5))
    await gateway.start()
    try:
        async with running(settings, workers):
            streams_of: list[RecordingStream] = []

            async def hello(turn: int) -> None:
                stream = RecordingStream()
                request = HelloRequest(
                    node_id="n1",
                    cert_serial="n1-serial",
                    role="worker",
                    boot_id=f"machine-{turn % 2}",
                    journal_id="j1",
                )
                await gateway.hello(request, stream)
                streams_of.append(stream)

            await hello(0)
            for turn in range(1, 5):
                await hello(turn)
                await eventually(lambda t=turn: _counted(db, t), what=f"alternation {turn}")  # type: ignore[misc]
                if turn == 1:
                    condition = await db.fetchval("SELECT condition FROM node_conditions")
                    assert condition == "DuplicateIdentity"  # from the first counted one
            held = await db.fetchrow("SELECT held, revoked_at FROM quarantines")
            assert (held["held"], held["revoked_at"]) == ("one-gateway", None)
            command = await db.fetchval("SELECT enqueue_command('n1', 'noop', '{}')")
            for turn in (5, 6):  # a new window: counted, its session's own hold released
                await hello(turn)
                await eventually(lambda t=turn: _counted(db, t), what=f"alternation {turn}")  # type: ignore[misc]
                await eventually(lambda: _released(db), what=f"session {turn} released")
            await asyncio.sleep(1.0)  # dispatch rounds, had any session been sent anything
            assert [s.delivered for s in streams_of] == [[]] * 7
            state = await db.fetchval("SELECT state FROM commands WHERE command_id = $1", command)
            assert state == "pending"
            duplicates = await _bodies(nc, subjects, "security.node.duplicate-session")
            assert [(d["alternations"], d["quarantined"], d["held"]) for d in duplicates] == [
                (1, False, False),
                (2, False, False),
                (3, False, False),
                (4, False, True),
                (1, False, True),
                (2, False, True),
            ]
            assert await db.fetchval("SELECT count(*) FROM node_conditions") == 1

            monkeypatch.setenv("BCW_DATABASE_URL", database_url)
            argv = ["quarantine", "dismiss", "--node", "n1", "--by", "al"]
            assert await asyncio.to_thread(main, argv) == 0
            await eventually(lambda: _delivered(streams_of[-1]), what="the command, dismissed")
            assert [d.command_id for d in streams_of[-1].delivered] == [command]
            assert (
                await db.fetchval("SELECT count(*) FROM node_certs WHERE revoked_at IS NOT NULL")
                == 0
            )
    finally:
        await gateway.stop(graceful=False)


async def _counted(db: asyncpg.Connection, alternations: int) -> bool:
    """As many alternations counted (each epoch after the first is one)."""
    return await db.fetchval("SELECT count(*) FROM node_alternations") == alternations


async def _bodies(nc: NATS, subjects: Subjects, bc_type: str) -> list[dict[str, object]]:
    messages = await stream_messages(nc.jetstream(), subjects.events_stream)
    return [json.loads(m.data) for m in messages if m.headers and m.headers["Bc-Type"] == bc_type]
