"""The reference gateway on real servers: admission codes from real rows, the Hello
transaction, pushback, and the lease (a gateway whose lease was taken refuses Hellos and
its stale writes match nothing)."""

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
from schemas.notices import Dispatch, Zombie
from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.streams import RecordingStream
from tests.integration.support import stream_messages
from workers.gateway import Code, Gateway, GatewaySettings, HelloRequest, Refused, store
from workers.runtime.bus import streams
from workers.sim.daemon import FakeDaemon


@pytest.fixture
async def pool(database_url: str):  # type: ignore[no-untyped-def]
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    yield pool
    await pool.close()


@pytest.fixture
async def gateway(pool: asyncpg.Pool, nc: NATS, subjects: Subjects):  # type: ignore[no-untyped-def]
    await streams.provision_streams(nc.jetstream(), subjects)
    gw = Gateway("gw-a", pool, nc, subjects)
    await gw.start()
    yield gw
    if gw.alive:
        await gw.stop(graceful=False)


def request(**kw: Any) -> HelloRequest:
    fields = {
        "node_id": "n1",
        "cert_serial": "n1-serial",
        "role": "worker",
        "boot_id": "b1",
        "journal_id": "j1",
    }
    return HelloRequest(**{**fields, **kw})


async def test_each_refusal_code_from_real_rows(gateway: Gateway, db: asyncpg.Connection) -> None:
    await fleet.join(db, "n1")
    await fleet.join(db, "n2")
    await fleet.join(db, "n1", "n1-serial-new")  # n1's first certificate is now an older generation
    await fleet.join(db, "n3", "n3-serial")
    await db.execute(
        "UPDATE node_certs SET revoked_at = now(), revocation_reason = 'x' WHERE serial = 'n3-serial'"
    )
    cases = [
        (request(boot_id=""), Code.INVALID_ARGUMENT),
        (request(node_id="ghost", cert_serial="n2-serial"), Code.PERMISSION_DENIED),
        (request(cert_serial="nope", role="admin"), Code.PERMISSION_DENIED),
        (request(node_id="n3", cert_serial="n3-serial"), Code.UNAUTHENTICATED),
        (request(cert_serial="n1-serial"), Code.UNAUTHENTICATED),
        (request(cert_serial="n2-serial"), Code.PERMISSION_DENIED),
        (request(cert_serial="n1-serial-new", role="admin"), Code.PERMISSION_DENIED),
    ]
    for hello, code in cases:
        with pytest.raises(Refused) as refused:
            await gateway.hello(hello, RecordingStream())
        assert refused.value.code is code, hello
    welcome = await gateway.hello(request(cert_serial="n1-serial-new"), RecordingStream())
    assert welcome.epoch == 1


async def test_a_serial_with_no_record_is_admitted_unrestricted(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")  # its recorded certificate restricts nothing either way
    await db.execute("UPDATE node_certs SET allowed_kinds = '{noop}'")
    welcome = await gateway.hello(request(cert_serial="not-recorded"), RecordingStream())
    assert welcome.epoch == 1
    [fact] = await stream_messages(nc.jetstream(), subjects.facts_stream)
    cert = json.loads(fact.data)["cert"]
    assert cert == {"serial": "not-recorded", "allowed_kinds": None, "identity_generation": None}
    assert gateway.sessions["n1"].cert_not_after == float("inf")  # no expiry of record


async def test_any_capability_list_connects_and_a_fact_that_cannot_be_published_bumps_nothing(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")
    caps = [f"cap-{i}" for i in range(2000)] + ["x" * 300]
    welcome = await gateway.hello(request(capabilities=caps), RecordingStream())
    assert welcome.epoch == 1
    [fact] = [m for m in await stream_messages(nc.jetstream(), subjects.facts_stream)]
    import json

    assert len(json.loads(fact.data)["capabilities"]) == 2001
    with pytest.raises(Refused) as refused:  # a version no fact can carry (over 256 chars)
        await gateway.hello(request(boot_id="b2", daemon_version="9" * 300), RecordingStream())
    assert refused.value.code is Code.INVALID_ARGUMENT
    assert "daemon_version" in str(refused.value)
    with pytest.raises(Refused) as refused:  # a digest that is not SHA-256 hex: not a CHECK error
        await gateway.hello(request(boot_id="b3", approver_set_sha256="XYZ"), RecordingStream())
    assert refused.value.code is Code.INVALID_ARGUMENT
    assert "approver_set_sha256" in str(refused.value)
    assert await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n1'") == 1


async def test_a_draining_gateway_refuses_hellos_and_a_node_without_a_row_is_denied(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    await db.execute("UPDATE gateways SET draining = true WHERE gateway_id = 'gw-a'")
    with pytest.raises(Refused) as refused:
        await gateway.hello(request(), RecordingStream())
    assert refused.value.code is Code.UNAVAILABLE and refused.value.retry_after is not None
    assert gateway.alive  # draining is not a lost lease: its sessions stay
    await db.execute("UPDATE gateways SET draining = false WHERE gateway_id = 'gw-a'")
    await db.execute("DELETE FROM node_sessions WHERE node_id = 'n1'")
    with pytest.raises(Refused) as refused:
        await gateway.hello(request(), RecordingStream())
    assert refused.value.code is Code.PERMISSION_DENIED
    assert await db.fetchval("SELECT count(*) FROM session_epochs") == 0


async def test_a_session_ends_when_its_certificate_expires(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")
    await db.execute("UPDATE node_certs SET not_after = compute_now() + interval '10 minutes'")
    stream = RecordingStream()
    await gateway.hello(request(), stream)
    await gateway.tick()
    assert "n1" in gateway.sessions
    gateway.clock = lambda: time.time() + 11 * 60  # the gateway's clock past the expiry
    gateway.heartbeat("n1", 1)  # still heartbeating: only the certificate ends it
    await gateway.tick()
    assert "n1" not in gateway.sessions and stream.dropped == ["certificate-expired"]
    closed = [json.loads(m.data) for m in await stream_messages(nc.jetstream(), subjects.facts_stream)
              if m.headers["Bc-Type"] == "closed"]  # fmt: skip
    assert [c["reason"] for c in closed] == ["certificate-expired"]


async def test_the_hello_stores_trust_version_as_sent_and_its_approver_set(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    await db.execute("UPDATE node_sessions SET trust_version = 9")  # a report raised it once
    digest = "ab" * 32
    await gateway.hello(
        request(trust_version=4, approver_set_epoch=3, approver_set_sha256=digest),
        RecordingStream(),
    )
    row = await db.fetchrow(
        "SELECT trust_version, approver_set_epoch, approver_set_sha256 FROM node_sessions"
    )
    assert tuple(row) == (4, 3, digest)  # as sent: a Hello is the daemon's word
    await gateway.hello(
        request(boot_id="b2", trust_version=5, approver_set_sha256=""), RecordingStream()
    )
    row = await db.fetchrow(
        "SELECT trust_version, approver_set_epoch, approver_set_sha256 FROM node_sessions"
    )
    assert tuple(row) == (5, None, None)  # an empty digest stores NULL in both


async def test_a_zombie_notice_and_a_graceful_shutdown_close_their_sessions(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")
    await fleet.join(db, "n2")
    first, second = RecordingStream(), RecordingStream()
    one = await gateway.hello(request(), first)
    await gateway.hello(request(node_id="n2", cert_serial="n2-serial"), second)
    notice = Zombie(node_id="n1", epoch=one.epoch + 1)  # another epoch: not this session
    body, headers = REGISTRY.encode(notice)
    js = nc.jetstream()
    await js.publish(subjects.notice("gw-a", "zombie"), body, headers=headers)
    notice = Zombie(node_id="n1", epoch=one.epoch)
    body, headers = REGISTRY.encode(notice)
    await js.publish(subjects.notice("gw-a", "zombie"), body, headers=headers)
    for _ in range(100):
        if "n1" not in gateway.sessions:
            break
        await asyncio.sleep(0.05)
    assert first.dropped == ["fenced"] and "n2" in gateway.sessions
    await gateway.stop(graceful=True)
    assert second.dropped == ["gateway-shutdown"] and gateway.sessions == {}
    closed = [json.loads(m.data) for m in await stream_messages(js, subjects.facts_stream)
              if m.headers["Bc-Type"] == "closed"]  # fmt: skip
    assert [(c["node_id"], c["reason"]) for c in closed] == [
        ("n1", "fenced"), ("n2", "gateway-shutdown")
    ]  # fmt: skip


async def test_a_duplicate_hello_holds_its_session_and_a_serial_revoked_meanwhile_is_refused(
    gateway: Gateway, db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    await fleet.join(db, "n1")

    async def held() -> Any:
        return await db.fetchval("SELECT held_epoch FROM node_sessions")

    await gateway.hello(request(boot_id="b1"), RecordingStream())
    assert await held() is None  # nobody was live before
    await gateway.hello(request(boot_id="b2"), RecordingStream())  # b1 still live: another machine
    assert await held() == 2
    await gateway.hello(request(boot_id="b2"), RecordingStream())  # the same machine again
    assert await held() is None
    await db.execute("UPDATE node_certs SET revoked_at = now(), revocation_reason = 'x'")
    assert gateway.lease_epoch is not None
    async with pool.acquire() as conn:  # past admission, as if it had read before the revoke
        with pytest.raises(store.Revoked):
            await store.open_session(
                conn, "gw-a", gateway.lease_epoch, request(boot_id="b3"), False,
                GatewaySettings().live_window,
            )  # fmt: skip
    assert await db.fetchval("SELECT session_epoch FROM node_sessions") == 3


async def test_the_welcome_tells_server_time_acked_events_and_credits(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    before = time.time()
    first = await gateway.hello(request(), RecordingStream())
    assert before <= first.server_time <= time.time()
    assert (first.acked_event_seq, first.credits) == (0, 8)
    await db.execute("UPDATE node_sessions SET acked_event_seq = 7")
    same_journal = await gateway.hello(request(boot_id="b2"), RecordingStream())
    assert same_journal.acked_event_seq == 7  # re-send the journal after seq 7
    new_journal = await gateway.hello(request(boot_id="b3", journal_id="j2"), RecordingStream())
    assert new_journal.acked_event_seq == 0


async def test_the_first_frame_must_be_hello_and_any_frame_refreshes_last_seen(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    command = uuid.uuid4()
    with pytest.raises(Refused) as refused:
        await gateway.progress("n1", 1, command, "acked")
    assert refused.value.code is Code.INVALID_ARGUMENT
    welcome = await gateway.hello(request(), RecordingStream())
    with pytest.raises(Refused):  # another epoch: not this stream's
        await gateway.result("n1", welcome.epoch + 1, command, "done", {}, None)
    gateway.sessions["n1"].last_seen = 0.0
    await gateway.progress("n1", welcome.epoch, command, "acked")
    assert gateway.sessions["n1"].last_seen > 0.0


async def test_a_welcome_six_minutes_behind_the_mark_ends_the_fake_daemons_session(
    gateway: Gateway, db: asyncpg.Connection, pool: asyncpg.Pool, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")
    behind = Gateway("gw-behind", pool, nc, subjects, clock=lambda: time.time() - 360)
    await behind.start()
    try:
        daemon = FakeDaemon("n1", "n1-serial", time.time, random.Random(1), home=0)
        await daemon.tick([gateway, behind])  # home: the gateway on time sets the mark
        assert daemon.gateway is gateway and daemon.server_time_mark > 0
        daemon.drop("test")
        daemon.next_try = 0.0
        await daemon.tick([behind])  # the only gateway left is 6 minutes behind
        assert daemon.gateway is None and daemon.behind_welcomes == 1
        assert "n1" not in behind.sessions  # the stream was closed at once
        daemon.next_try = 0.0
        await daemon.tick([gateway, behind])  # and the next attempt goes elsewhere
        assert daemon.gateway is gateway
    finally:
        await behind.stop(graceful=False)


async def test_the_hello_transaction_and_its_fact(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")
    first = await gateway.hello(request(), RecordingStream())
    await db.execute("UPDATE node_sessions SET acked_event_seq = 7")
    old_stream = RecordingStream()
    gateway.sessions["n1"].stream = old_stream
    second = await gateway.hello(request(boot_id="b2", journal_id="j2"), RecordingStream())
    assert (first.epoch, second.epoch) == (1, 2)
    row = await db.fetchrow("SELECT * FROM node_sessions WHERE node_id = 'n1'")
    assert (row["session_epoch"], row["gateway_id"], row["boot_id"], row["journal_id"], row["acked_event_seq"]) == (
        2, "gw-a", "b2", "j2", 0,  # a new journal resets the ack
    )  # fmt: skip
    assert old_stream.dropped == ["superseded"]
    facts = [m for m in await stream_messages(nc.jetstream(), subjects.facts_stream)]
    types = [m.headers["Bc-Type"] for m in facts]
    assert types == ["hello", "closed", "hello"]
    import json

    hello = json.loads(facts[2].data)
    assert hello["previous"] == {
        "epoch": 1,
        "gateway_id": "gw-a",
        "boot_id": "b1",
        "journal_id": "j1",
        "live": True,
    }
    assert hello["epoch"] == 2 and hello["cert"]["serial"] == "n1-serial"


async def test_pushback_when_too_many_hellos_are_pending(
    pool: asyncpg.Pool, nc: NATS, subjects: Subjects, db: asyncpg.Connection
) -> None:
    await streams.provision_streams(nc.jetstream(), subjects)
    gw = Gateway(
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
                gw.hello(request(node_id=f"p{i}", cert_serial=f"p{i}-serial"), RecordingStream())
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
    await gateway.hello(request(), RecordingStream())
    usurper = Gateway("gw-a", pool, nc, subjects)  # a new incarnation of the same gateway id
    await usurper.start()
    try:
        with pytest.raises(Refused) as refused:
            await gateway.hello(request(node_id="n2", cert_serial="n2-serial"), RecordingStream())
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
                )
        assert (
            await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n2'") == 0
        )
        assert not gateway.alive
        await usurper.hello(request(node_id="n2", cert_serial="n2-serial"), RecordingStream())
        assert (
            await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n2'") == 1
        )
    finally:
        await usurper.stop(graceful=False)


async def test_dispatch_is_delivered_only_to_the_live_session_at_that_epoch(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    import uuid

    from schemas import REGISTRY

    await fleet.join(db, "n1")
    stream = RecordingStream()
    welcome = await gateway.hello(request(), stream)
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


async def test_max_streams_pushes_back(
    pool: asyncpg.Pool, nc: NATS, subjects: Subjects, db: asyncpg.Connection
) -> None:
    await streams.provision_streams(nc.jetstream(), subjects)
    gw = Gateway("gw-c", pool, nc, subjects, settings=GatewaySettings(max_streams=1))
    await gw.start()
    try:
        await fleet.join(db, "n1")
        await fleet.join(db, "n2")
        await gw.hello(request(), RecordingStream())
        with pytest.raises(Refused) as refused:
            await gw.hello(request(node_id="n2", cert_serial="n2-serial"), RecordingStream())
        assert refused.value.code is Code.RESOURCE_EXHAUSTED and refused.value.retry_after
        await gw.hello(
            request(boot_id="b2"), RecordingStream()
        )  # the same node again is not a new stream
    finally:
        await gw.stop(graceful=False)


async def test_silent_sessions_time_out_and_revoked_ones_are_dropped(
    pool: asyncpg.Pool, nc: NATS, subjects: Subjects, db: asyncpg.Connection
) -> None:
    import json
    import time

    from schemas import REGISTRY, Revocations

    await streams.provision_streams(nc.jetstream(), subjects)
    now = [time.time()]
    gw = Gateway("gw-d", pool, nc, subjects, clock=lambda: now[0])
    await gw.start()
    try:
        for node in ("quiet", "talker", "revoked"):
            await fleet.join(db, node)
        daemon_streams = {node: RecordingStream() for node in ("quiet", "talker", "revoked")}
        welcomes = {
            node: await gw.hello(
                request(node_id=node, cert_serial=f"{node}-serial"), daemon_streams[node]
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
        facts = await stream_messages(nc.jetstream(), subjects.facts_stream)
        closed = sorted(
            (json.loads(m.data)["node_id"], json.loads(m.data)["reason"])
            for m in facts
            if m.headers["Bc-Type"] == "closed"
        )
        assert closed == [("quiet", "heartbeat-timeout"), ("revoked", "revoked")]
        flushes = [json.loads(m.data) for m in facts if m.headers["Bc-Type"] == "liveness"]
        assert flushes and {e["node_id"] for e in flushes[-1]["entries"]} == {
            "talker",
            "revoked",
        }  # before the revocation
    finally:
        await gw.stop(graceful=False)


async def test_the_welcome_and_every_10th_heartbeat_ask_for_the_sections_not_held(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    first = await gateway.hello(
        request(inventory_hashes={"cpu": "c1", "gpu": "g1"}), RecordingStream()
    )
    assert first.request_sections == ("cpu", "gpu")  # nothing held yet
    await gateway.inventory("n1", first.epoch, "cpu", "c1", {"cores": 8})
    await gateway.inventory("n1", first.epoch, "gpu", "g1", {"count": 2})
    again = await gateway.hello(
        request(boot_id="b2", inventory_hashes={"cpu": "c1", "gpu": "g2", "disk": "d1"}),
        RecordingStream(),
    )
    assert again.request_sections == ("disk", "gpu")  # cpu is held as it is
    await gateway.inventory("n1", again.epoch, "gpu", "g2", {"count": 4})
    assert gateway.heartbeat("n1", again.epoch, inventory_hashes={"cpu": "c1", "gpu": "g2"}) == ()
    assert gateway.heartbeat("n1", again.epoch, inventory_hashes={"cpu": "c9", "gpu": "g2"}) == (
        "cpu",
    )
    assert gateway.heartbeat("n1", again.epoch) == ()  # the other nine carry no hashes
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
    one = await gateway.hello(request(), RecordingStream())
    two = await gateway.hello(request(node_id="n2", cert_serial="n2-serial"), RecordingStream())
    gateway.heartbeat("n1", one.epoch, {"default": 3}, load=1.5, applied_generation=4)
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
    [status] = [body(m) for m in facts if m.headers["Bc-Type"] == "status"]
    assert (status["node_id"], status["epoch"], status["observed_generation"]) == ("n1", 1, 4)
    assert status["trust_version"] == 0  # unchanged


async def test_the_fake_daemon_sends_what_is_asked_and_its_10th_heartbeat_tells_a_change(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    now = [time.time()]
    gateway.clock = lambda: now[0]
    daemon = FakeDaemon("n1", "n1-serial", lambda: now[0], random.Random(1))
    await daemon.tick([gateway])
    assert daemon.connected and daemon.sections_sent == 2

    async def stored() -> dict[str, Any]:
        rows = await db.fetch("SELECT section, body FROM node_inventory")
        return {r["section"]: json.loads(r["body"]) for r in rows}

    assert await stored() == daemon.inventory
    daemon.inventory["hardware"] = {"cpus": 16, "memory_gib": 64}
    for beat in range(1, 11):
        now[0] += 10
        await daemon.tick([gateway])
        assert daemon.sections_sent == (2 if beat < 10 else 3), beat
    assert (await stored())["hardware"] == {"cpus": 16, "memory_gib": 64}
