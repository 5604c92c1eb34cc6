"""The reference gateway's sessions on real servers: pushback, the lease (a gateway whose
lease was taken refuses Hellos and its stale writes match nothing), dispatch to the live
session only, silent and revoked sessions, heartbeats and inventory sections."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas import REGISTRY
from schemas.facts import MAX_INVENTORY_SECTIONS, NodeLoad
from schemas.notices import Dispatch
from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.gateway.hellos import request
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, stream_messages
from workers.gateway import Code, Gateway, GatewaySettings, Refused, store
from workers.runtime.bus import streams
from workers.sim.daemon import FakeDaemon


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
    import json

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
    import json
    import time

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


async def test_only_reported_sections_are_stored_whole_and_a_node_holds_a_bounded_number(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    welcome = await fleet.say_hello(gateway, request(inventory_hashes={"cpu": "c1"}))
    # pushed, never reported: held, never stored
    await gateway.inventory("n1", welcome.epoch, "secrets", "s1", {"x": 1})
    await gateway.inventory("n1", welcome.epoch, "cpu", "c1", {"cores": 8})
    await gateway.inventory("n1", welcome.epoch, "cpu", "c1", {"cores": 8})  # stored: nothing
    stored_now = await db.fetch("SELECT section, hash FROM node_inventory WHERE node_id = 'n1'")
    assert [tuple(r) for r in stored_now] == [("cpu", "c1")]
    # a node holds at most 256 sections: the 256th is stored, no new one after it (an old
    # one is still updated)
    assert MAX_INVENTORY_SECTIONS == 256
    await db.execute(
        "INSERT INTO node_inventory (node_id, section, hash, body, session_epoch, reported_at) "
        "SELECT 'n1', 'old-' || i, 'h', '{}', 1, now() FROM generate_series(1, 254) i"
    )
    hashes = {"cpu": "c2", "new": "n1", "newer": "n2"}
    again = await fleet.say_hello(gateway, request(boot_id="b2", inventory_hashes=hashes))
    assert again.request_sections == ("cpu", "new", "newer")
    await gateway.inventory("n1", again.epoch, "new", "n1", {"x": 1})
    await gateway.inventory("n1", again.epoch, "newer", "n2", {"x": 2})
    unapplied = await db.fetchval("SELECT count(*) FROM node_inventory WHERE section LIKE 'new%'")
    assert unapplied == 0  # half a collection is never applied: cpu is still to come
    await gateway.inventory("n1", again.epoch, "cpu", "c2", {"cores": 16})
    stored = dict(await db.fetch("SELECT section, hash FROM node_inventory WHERE node_id = 'n1'"))
    assert len(stored) == 256 and "new" in stored and "newer" not in stored
    assert stored["cpu"] == "c2"


async def test_the_welcome_and_every_10th_heartbeat_ask_for_the_sections_not_held(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    first = await fleet.say_hello(gateway, request(inventory_hashes={"cpu": "c1", "gpu": "g1"}))
    assert first.request_sections == ("cpu", "gpu")  # nothing held yet
    await gateway.inventory("n1", first.epoch, "cpu", "c1", {"cores": 8})
    await gateway.inventory("n1", first.epoch, "gpu", "g1", {"count": 2})
    again = await fleet.say_hello(
        gateway, request(boot_id="b2", inventory_hashes={"cpu": "c1", "gpu": "g2", "disk": "d1"})
    )
    assert again.request_sections == ("disk", "gpu")  # cpu is held as it is
    await gateway.inventory("n1", again.epoch, "gpu", "g2", {"count": 4})
    beat = gateway.heartbeat
    assert (
        beat("n1", again.epoch, inventory_hashes={"cpu": "c1", "gpu": "g2"}).request_sections == ()
    )

    async def gpu_applied() -> bool:  # disk is no longer reported: the collection agrees
        stored = await db.fetchval("SELECT hash FROM node_inventory WHERE section = 'gpu'")
        return stored == "g2" == gateway.sessions["n1"].inventory.get("gpu")  # and it knows

    await eventually(gpu_applied, what="the held gpu section applied after the heartbeat")
    assert beat(
        "n1", again.epoch, inventory_hashes={"cpu": "c9", "gpu": "g2"}
    ).request_sections == ("cpu",)
    assert beat("n1", again.epoch).request_sections == ()  # the other nine carry no hashes
    with pytest.raises(Refused) as refused:  # not this stream's epoch
        await gateway.inventory("n1", first.epoch, "cpu", "c0", {"cores": 1})
    assert refused.value.code is Code.INVALID_ARGUMENT
    with pytest.raises(Refused) as refused:
        await gateway.inventory("n1", again.epoch, "cpu", "c9", ["not", "an", "object"])  # type: ignore[arg-type]
    assert refused.value.code is Code.INVALID_ARGUMENT
    # the node moved to another session behind this gateway's back: its frame writes nothing
    await db.execute("UPDATE node_sessions SET session_epoch = session_epoch + 1")
    await gateway.inventory("n1", again.epoch, "cpu", "c9", {"cores": 1})
    rows = await db.fetch(
        "SELECT section, hash, body::text, session_epoch FROM node_inventory ORDER BY 1"
    )
    assert [tuple(r) for r in rows] == [
        ("cpu", "c1", '{"cores": 8}', 1),
        ("gpu", "g2", '{"count": 4}', 2),
    ]


async def test_heartbeats_carry_load_and_the_applied_generation_to_the_flush(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")
    await fleet.join(db, "n2")
    one = await fleet.say_hello(gateway, request())
    two = await fleet.say_hello(gateway, request(node_id="n2", cert_serial="n2-serial"))
    node_load = NodeLoad(
        load_average=1.5, memory_available_bytes=2**30, running_commands=2, pending_events=7
    )
    ack = gateway.heartbeat("n1", one.epoch, {"default": 3}, load=node_load, applied_generation=4)
    assert abs(ack.server_time - time.time()) < 5  # its server time: the daemon's mark moves
    # a load the schema refuses is that heartbeat's refusal, and changes nothing: the
    # flush (every session's) still goes out, with the last good load
    bad = NodeLoad(**{**node_load, "load_average": -1.0})
    with pytest.raises(Refused, match=r"load\.load_average: Input should be greater"):
        gateway.heartbeat("n1", one.epoch, {"default": 0}, load=bad)
    with pytest.raises(Refused, match="load: Input should be a finite number"):
        gateway.heartbeat("n2", two.epoch, {"default": 0}, load=float("nan"))
    gateway.heartbeat("n1", one.epoch, applied_generation=2)  # older: the highest stays
    gateway.heartbeat("n2", two.epoch)  # an older daemon: nothing but the heartbeat
    await gateway.flush()
    await gateway.flush()  # the generation was reported once

    def body(m: Any) -> dict[str, Any]:
        return dict(json.loads(m.data))

    facts = await stream_messages(nc.jetstream(), subjects.facts_stream)
    [flush, _] = [body(m) for m in facts if m.headers["Bc-Type"] == "liveness"]
    entries = {e["node_id"]: (e["credits"], e["load"]) for e in flush["entries"]}
    assert entries == {"n1": ({"default": 3}, 1.5), "n2": (None, None)}
    loads = {e["node_id"]: e["node_load"] for e in flush["entries"]}
    assert loads == {"n1": node_load, "n2": None}
    [status] = [body(m) for m in facts if m.headers["Bc-Type"] == "status"]
    assert (status["node_id"], status["epoch"], status["observed_generation"]) == ("n1", 1, 4)
    assert status["trust_version"] == 0  # unchanged


async def test_the_fake_daemon_sends_what_is_asked_and_its_next_heartbeat_tells_a_change(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    now = [time.time()]
    gateway.clock = lambda: now[0]
    daemon = FakeDaemon(
        "n1", "n1-serial", lambda: now[0], random.Random(1), hello_key=fleet.hello_key("n1")
    )
    await daemon.tick([gateway])
    assert daemon.connected and daemon.sections_sent == 2

    async def stored() -> dict[str, Any]:
        rows = await db.fetch("SELECT section, body FROM node_inventory")
        return {r["section"]: json.loads(r["body"]) for r in rows}

    assert await stored() == daemon.inventory
    # collected again: the next heartbeat carries the hashes, the section pushed with it
    daemon.inventory["hardware"] = {"cpus": 16, "memory_gib": 64}
    now[0] += 10
    await daemon.tick([gateway])
    assert daemon.sections_sent == 3
    digest = daemon.inventory_hashes()["hardware"]

    async def applied() -> bool:  # stored, and noted by the gateway (after its commit)
        known = gateway.sessions["n1"].inventory.get("hardware") == digest
        return known and (await stored()).get("hardware") == {"cpus": 16, "memory_gib": 64}

    await eventually(applied, what="the changed section applied at the first heartbeat")
    for _ in range(10):  # nothing changed since: nothing is sent again
        now[0] += 10
        await daemon.tick([gateway])
    assert daemon.sections_sent == 3 and await stored() == daemon.inventory
