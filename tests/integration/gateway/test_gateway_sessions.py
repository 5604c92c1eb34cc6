"""The reference gateway's sessions on real servers: pushback, the lease (a gateway whose
lease was taken refuses Hellos and its stale writes match nothing), dispatch to the live
session only, silent and revoked sessions (heartbeats and inventory sections:
test_gateway_heartbeats.py)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas import REGISTRY
from schemas.notices import Dispatch
from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.gateway.hellos import request
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, stream_messages
from workers.gateway import Code, Gateway, GatewaySettings, Refused, store
from workers.runtime.bus import streams


async def test_pushback_when_too_many_hellos_are_pending(
    pool: asyncpg.Pool, nc: NATS, subjects: Subjects, db: asyncpg.Connection
) -> None:
    await streams.provision_streams(nc.jetstream(), subjects)
    gw = Provisioned(
        "gw-b",
        pool,
        nc,
        subjects,
        settings=GatewaySettings(max_pending_hellos=2, handshakes_per_second=1000),
    )
    await gw.start()
    try:
        for i in range(20):
            await fleet.join(db, f"p{i}")
        results = await asyncio.gather(
            *(
                fleet.say_hello(gw, request(node_id=f"p{i}", cert_serial=f"p{i}-serial"))
                for i in range(20)
            ),
            return_exceptions=True,
        )
        pushed = [r for r in results if isinstance(r, Refused)]
        assert pushed and all(r.code is Code.RESOURCE_EXHAUSTED and r.retry_after for r in pushed)
        assert len(pushed) < 20
    finally:
        await gw.stop(graceful=False)


async def test_a_gateway_whose_lease_was_taken_refuses_and_writes_nothing(
    pool: asyncpg.Pool, nc: NATS, subjects: Subjects, db: asyncpg.Connection, gateway: Gateway
) -> None:
    await fleet.join(db, "n1")
    await fleet.join(db, "n2")
    await fleet.say_hello(gateway, request())
    usurper = Provisioned("gw-a", pool, nc, subjects)  # a new incarnation of the same gateway id
    await usurper.start()
    try:
        with pytest.raises(Refused) as refused:
            await fleet.say_hello(gateway, request(node_id="n2", cert_serial="n2-serial"))
        assert refused.value.code is Code.UNAVAILABLE
        assert (
            await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n2'") == 0
        )
        with pytest.raises(store.LeaseGone):
            async with pool.acquire() as conn:
                await store.open_session(
                    conn,
                    "gw-a",
                    1,
                    request(node_id="n2", cert_serial="n2-serial"),
                    False,
                    GatewaySettings().live_window,
                    None,
                    uuid.uuid4(),
                )
        assert (
            await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n2'") == 0
        )
        assert not gateway.alive
        await gateway.stop(graceful=True)  # stopped by its lost lease: a second stop does nothing
        await fleet.say_hello(usurper, request(node_id="n2", cert_serial="n2-serial"))
        assert (
            await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n2'") == 1
        )
    finally:
        await usurper.stop(graceful=False)


async def test_dispatch_is_delivered_only_to_the_live_session_at_that_epoch(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:

    from schemas import REGISTRY

    await fleet.join(db, "n1")
    stream = RecordingStream()
    welcome = await fleet.say_hello(gateway, request(), stream)
    js = nc.jetstream()
    for epoch in (welcome.epoch + 1, welcome.epoch):
        notice = Dispatch(
            node_id="n1",
            epoch=epoch,
            command_id=uuid.uuid4(),
            seq=epoch,
            kind="exec",
            lane="default",
            attempt=1,
            payload={},
        )
        body, headers = REGISTRY.encode(notice)
        await js.publish(subjects.notice("gw-a", "dispatch"), body, headers=headers)
    for _ in range(50):
        if stream.delivered:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)
    assert [d.epoch for d in stream.delivered] == [welcome.epoch]


async def test_a_notice_from_a_newer_worker_is_read_tolerantly(
    gateway: Gateway,
    db: asyncpg.Connection,
    nc: NATS,
    subjects: Subjects,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A notice type this gateway does not know is skipped; a known one with a field added
    later is obeyed (docs/contract.md, Compatibility)."""

    from schemas import REGISTRY

    await fleet.join(db, "n1")
    stream = RecordingStream()
    welcome = await fleet.say_hello(gateway, request(), stream)
    js = nc.jetstream()
    unknown = {"Bc-Type": "drain", "Bc-Schema": "1", "Nats-Msg-Id": str(uuid.uuid4())}
    await js.publish(subjects.notice("gw-a", "drain"), b'{"node_id": "n1"}', headers=unknown)
    notice = Dispatch(
        node_id="n1",
        epoch=welcome.epoch,
        command_id=uuid.uuid4(),
        seq=1,
        kind="exec",
        lane="default",
        attempt=1,
        payload={},
    )
    body, headers = REGISTRY.encode(notice)
    later = json.dumps({**json.loads(body), "deadline_ms": 5000}).encode()
    await js.publish(subjects.notice("gw-a", "dispatch"), later, headers=headers)
    for _ in range(50):
        if stream.delivered:
            break
        await asyncio.sleep(0.1)
    assert [d.command_id for d in stream.delivered] == [notice.command_id]
    gateway_records = [r for r in caplog.records if r.name.startswith("workers.gateway")]
    assert [r.levelname for r in gateway_records if r.levelname != "INFO"] == ["WARNING"]
    assert "skips a notice: unknown message type 'drain'" in caplog.text


async def test_max_streams_pushes_back(
    pool: asyncpg.Pool, nc: NATS, subjects: Subjects, db: asyncpg.Connection
) -> None:
    await streams.provision_streams(nc.jetstream(), subjects)
    gw = Provisioned("gw-c", pool, nc, subjects, settings=GatewaySettings(max_streams=1))
    await gw.start()
    try:
        await fleet.join(db, "n1")
        await fleet.join(db, "n2")
        await fleet.say_hello(gw, request())
        with pytest.raises(Refused) as refused:
            await fleet.say_hello(gw, request(node_id="n2", cert_serial="n2-serial"))
        assert refused.value.code is Code.RESOURCE_EXHAUSTED and refused.value.retry_after
        await fleet.say_hello(gw, request(boot_id="b2"))  # the same node again is not a new stream
    finally:
        await gw.stop(graceful=False)


async def test_silent_sessions_time_out_and_revoked_ones_are_dropped(
    pool: asyncpg.Pool, nc: NATS, subjects: Subjects, db: asyncpg.Connection
) -> None:

    from schemas import Revocations

    await streams.provision_streams(nc.jetstream(), subjects)
    now = [time.time()]
    gw = Provisioned("gw-d", pool, nc, subjects, clock=lambda: now[0])
    await gw.start(autotick=None)
    try:
        for node in ("quiet", "talker", "revoked"):
            await fleet.join(db, node)
        daemon_streams = {node: RecordingStream() for node in ("quiet", "talker", "revoked")}
        welcomes = {
            node: await fleet.say_hello(
                gw, request(node_id=node, cert_serial=f"{node}-serial"), daemon_streams[node]
            )
            for node in daemon_streams
        }
        now[0] += 20
        gw.heartbeat("talker", welcomes["talker"].epoch)
        gw.heartbeat("revoked", welcomes["revoked"].epoch)
        now[0] += 11  # quiet: 31 s without a heartbeat, more than 3 x 10 s
        await gw.tick()
        assert (
            daemon_streams["quiet"].dropped == ["heartbeat-timeout"] and "quiet" not in gw.sessions
        )
        assert daemon_streams["quiet"].codes == ["UNAVAILABLE"]
        assert daemon_streams["talker"].dropped == [] and "talker" in gw.sessions
        body, headers = REGISTRY.encode(
            Revocations(node_id="revoked", serials=["revoked-serial"], reason="duplicate-identity")
        )
        await nc.publish(subjects.revocations, body, headers=headers)
        for _ in range(50):
            if daemon_streams["revoked"].dropped:
                break
            await asyncio.sleep(0.05)
        assert daemon_streams["revoked"].dropped == ["revoked"]
        assert daemon_streams["revoked"].codes == ["UNAUTHENTICATED"]

        async def closed_facts() -> list[tuple[str, str]]:  # the stream drops first, then says so
            facts = await stream_messages(nc.jetstream(), subjects.facts_stream)
            return sorted(
                (json.loads(m.data)["node_id"], json.loads(m.data)["reason"])
                for m in facts
                if m.headers["Bc-Type"] == "closed"
            )

        async def both_said() -> bool:
            return len(await closed_facts()) == 2

        await eventually(both_said, what="both closes said")
        assert await closed_facts() == [("quiet", "heartbeat-timeout"), ("revoked", "revoked")]
        facts = await stream_messages(nc.jetstream(), subjects.facts_stream)
        flushes = [json.loads(m.data) for m in facts if m.headers["Bc-Type"] == "liveness"]
        assert flushes and {e["node_id"] for e in flushes[-1]["entries"]} == {
            "talker",
            "revoked",
        }  # before the revocation
    finally:
        await gw.stop(graceful=False)


async def test_a_gateway_renews_its_lease_on_its_own_connections_while_its_calls_queue(
    database_url: str, nc: NATS, subjects: Subjects, db: asyncpg.Connection
) -> None:
    """A Hello storm holds every connection of a gateway's pool (here: its one, held by
    the test) for longer than its lease (2 s). With `lease_pool` its renewals do not queue
    behind the storm, and it keeps its lease; without, a renewal waits for a connection
    the storm holds — at a million nodes, every gateway of the rollout bench lost its
    lease that way."""
    await streams.provision_streams(nc.jetstream(), subjects)
    settings = GatewaySettings(lease_ttl=2.0, renew_every=0.5)
    calls = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    leases = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    own = Provisioned("gw-1", calls, nc, subjects, settings=settings, lease_pool=leases)
    shared = Provisioned("gw-2", calls, nc, subjects, settings=settings)
    try:
        await own.start(autotick=None)
        await shared.start(autotick=None)
        async with calls.acquire():  # the storm: every call connection taken
            for _ in range(8):  # 4 s: twice the lease
                await asyncio.sleep(0.5)
                await asyncio.wait_for(own.tick(), 1.0)
            assert own.alive
            with pytest.raises(TimeoutError):  # its renewal waits behind the storm
                await asyncio.wait_for(shared.tick(), 1.0)
        live = await db.fetchval(
            "SELECT lease_epoch = $1 AND lease_expires_at > compute_now() FROM gateways "
            "WHERE gateway_id = 'gw-1'",
            own.lease_epoch,
        )
        assert live
    finally:
        for gateway in (own, shared):
            await gateway.stop(graceful=False)
        await calls.close()
        await leases.close()
