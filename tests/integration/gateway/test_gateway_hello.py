"""The reference gateway's Hello on real servers, once admitted (admission:
test_gateway_admission.py): the Hello transaction and its fact, the Welcome, certificate
expiry, duplicate holds, zombie notices and a graceful shutdown."""

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
from schemas.notices import Zombie
from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.gateway.hellos import request
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, stream_messages
from workers.gateway import Code, Gateway, GatewaySettings, Refused, store
from workers.sim.daemon import FakeDaemon


async def test_a_session_ends_when_its_certificate_expires(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")
    await db.execute("UPDATE node_certs SET not_after = compute_now() + interval '10 minutes'")
    stream = RecordingStream()
    await fleet.say_hello(gateway, request(), stream)
    await gateway.tick()
    assert "n1" in gateway.sessions
    gateway.wall = lambda: time.time() + 11 * 60  # the gateway's wall clock past the expiry
    gateway.heartbeat("n1", 1)  # still heartbeating: only the certificate ends it
    await gateway.tick()
    assert "n1" not in gateway.sessions and stream.dropped == ["certificate-expired"]
    assert stream.codes == ["UNAUTHENTICATED"]  # the status the stream ends with
    closed = [
        json.loads(m.data)
        for m in await stream_messages(nc.jetstream(), subjects.facts_stream)
        if m.headers["Bc-Type"] == "closed"
    ]
    assert [c["reason"] for c in closed] == ["certificate-expired"]


async def test_the_hello_stores_trust_version_as_sent_and_its_approver_set(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    await db.execute("UPDATE node_sessions SET trust_version = 9")  # a report raised it once
    digest = "ab" * 32
    await fleet.say_hello(
        gateway, request(trust_version=4, approver_set_epoch=3, approver_set_sha256=digest)
    )
    row = await db.fetchrow(
        "SELECT trust_version, approver_set_epoch, approver_set_sha256 FROM node_sessions"
    )
    assert tuple(row) == (4, 3, digest)  # as sent: a Hello is the daemon's word
    await fleet.say_hello(gateway, request(boot_id="b2", trust_version=5, approver_set_sha256=""))
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
    one = await fleet.say_hello(gateway, request(), first)
    await fleet.say_hello(gateway, request(node_id="n2", cert_serial="n2-serial"), second)
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
    assert (first.dropped, first.codes) == (["fenced"], ["ABORTED"]) and "n2" in gateway.sessions
    await gateway.stop(graceful=True)
    assert (second.dropped, second.codes) == (["gateway-shutdown"], ["UNAVAILABLE"])
    assert gateway.sessions == {}
    assert await db.fetchval(  # its sessions closed, its lease given up rather than left to run
        "SELECT lease_expires_at <= compute_now() FROM gateways WHERE gateway_id = 'gw-a'"
    )
    closed = [
        json.loads(m.data)
        for m in await stream_messages(js, subjects.facts_stream)
        if m.headers["Bc-Type"] == "closed"
    ]
    assert [(c["node_id"], c["reason"], c["code"]) for c in closed] == [
        ("n1", "fenced", "ABORTED"),
        ("n2", "gateway-shutdown", "UNAVAILABLE"),
    ]


async def test_a_duplicate_hello_holds_its_session_and_a_serial_revoked_meanwhile_is_refused(
    gateway: Gateway, db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    await fleet.join(db, "n1")

    async def held() -> Any:
        return await db.fetchval("SELECT held_epoch FROM node_sessions")

    await fleet.say_hello(gateway, request(boot_id="b1"))
    assert await held() is None  # nobody was live before
    await fleet.say_hello(gateway, request(boot_id="b2"))  # b1 still live: another machine
    assert await held() == 2
    await fleet.say_hello(gateway, request(boot_id="b2"))  # the same machine again
    assert await held() is None
    await db.execute("UPDATE node_certs SET revoked_at = now(), revocation_reason = 'x'")
    assert gateway.lease_epoch is not None
    async with pool.acquire() as conn:  # past admission, as if it had read before the revoke
        with pytest.raises(store.Revoked):
            await store.open_session(
                conn,
                "gw-a",
                gateway.lease_epoch,
                request(boot_id="b3"),
                False,
                GatewaySettings().live_window,
                None,
                uuid.uuid4(),
            )
    assert await db.fetchval("SELECT session_epoch FROM node_sessions") == 3


async def test_the_welcome_tells_server_time_acked_events_and_credits(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    before = time.time()
    first = await fleet.say_hello(gateway, request())
    assert before <= first.server_time <= time.time()
    assert (first.acked_event_seq, first.credits) == (0, 8)
    await db.execute("UPDATE node_sessions SET acked_event_seq = 7")
    same_journal = await fleet.say_hello(gateway, request(boot_id="b2"))
    assert same_journal.acked_event_seq == 7  # re-send the journal after seq 7
    new_journal = await fleet.say_hello(gateway, request(boot_id="b3", journal_id="j2"))
    assert new_journal.acked_event_seq == 0


async def test_the_first_frame_must_be_hello_and_any_frame_refreshes_last_seen(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    command = uuid.uuid4()
    with pytest.raises(Refused) as refused:
        await gateway.progress("n1", 1, command, "acked")
    assert refused.value.code is Code.INVALID_ARGUMENT
    with pytest.raises(Refused) as refused:  # a heartbeat too: no frame before the Hello
        gateway.heartbeat("n1", 1)
    assert refused.value.code is Code.INVALID_ARGUMENT
    welcome = await fleet.say_hello(gateway, request())
    with pytest.raises(Refused):  # another epoch: not this stream's
        await gateway.result("n1", welcome.epoch + 1, command, "done", {}, None)
    with pytest.raises(Refused):
        gateway.heartbeat("n1", welcome.epoch + 1)
    for half in ({"approver_set_sha256": "a" * 64}, {"approver_set_epoch": 3}):
        with pytest.raises(Refused) as refused:  # not a database error
            await fleet.say_hello(gateway, request(boot_id="b9", **half))
        assert refused.value.code is Code.INVALID_ARGUMENT
    gateway.sessions["n1"].last_seen = 0.0
    await gateway.progress("n1", welcome.epoch, command, "acked")
    assert gateway.sessions["n1"].last_seen > 0.0


async def test_a_welcome_six_minutes_behind_the_mark_ends_the_fake_daemons_session(
    gateway: Gateway, db: asyncpg.Connection, pool: asyncpg.Pool, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")
    behind = Provisioned("gw-behind", pool, nc, subjects, wall=lambda: time.time() - 360)
    await behind.start()
    try:
        daemon = FakeDaemon(
            "n1", "n1-serial", time.time, random.Random(1), home=0, hello_key=fleet.hello_key("n1")
        )
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
    first = await fleet.say_hello(gateway, request())
    await db.execute(
        "UPDATE node_sessions SET acked_event_seq = 7, capabilities = '{old}', role = 'stale', "
        "daemon_version = '0.1', proto_max = 1, "
        "disconnected_at = compute_now() - interval '1 hour', connected_at = '2020-01-01Z'"
    )
    old_stream = RecordingStream()
    gateway.sessions["n1"].stream = old_stream
    second = await fleet.say_hello(
        gateway,
        request(
            boot_id="b2",
            journal_id="j2",
            daemon_version="2.1.0",
            proto_max=2,
            capabilities=["nvml", "NOT VALID", "cpu", "cpu"],
        ),
    )
    assert (first.epoch, second.epoch) == (1, 2)
    row = await db.fetchrow(
        "SELECT *, connected_at > compute_now() - interval '1 minute' AS connected_now "
        "FROM node_sessions WHERE node_id = 'n1'"
    )
    assert (
        row["session_epoch"],
        row["gateway_id"],
        row["boot_id"],
        row["journal_id"],
        row["acked_event_seq"],
    ) == (
        2,
        "gw-a",
        "b2",
        "j2",
        0,  # a new journal resets the ack
    )
    # the statement's other fields: the session's own from this Hello on
    assert (row["role"], row["daemon_version"], row["proto_max"]) == ("worker", "2.1.0", 2)
    assert row["connected_now"] and row["disconnected_at"] is None
    assert row["capabilities"] == ["cpu", "nvml"]  # the valid names, never the previous session's
    assert (old_stream.dropped, old_stream.codes) == (["superseded"], ["ABORTED"])
    facts = [m for m in await stream_messages(nc.jetstream(), subjects.facts_stream)]
    types = [m.headers["Bc-Type"] for m in facts]
    assert types == ["hello", "closed", "hello"]
    import json

    hello = json.loads(facts[2].data)
    # the gateway is told nothing of the session before: the workers read what the Hello
    # transaction recorded under the node's lock
    assert hello["previous"] == {
        "epoch": 1,
        "gateway_id": None,
        "boot_id": None,
        "journal_id": None,
        "live": True,  # the Hello transaction's judgement: the same node, live, on another boot
    }
    assert (hello["duplicate"], hello["proven"]) == (True, True)
    recorded = await db.fetchrow(
        "SELECT previous_epoch, previous_gateway_id, previous_boot_id, previous_journal_id, "
        "previous_live, proven FROM session_epochs WHERE node_id = 'n1' AND epoch = 2"
    )
    assert tuple(recorded) == (1, "gw-a", "b1", "j1", True, True)
    assert hello["epoch"] == 2 and hello["cert"]["serial"] == "n1-serial"


async def test_the_hello_transaction_stores_the_capabilities_and_leaves_the_session_unlabeled(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    """The Hello transaction writes the session's capabilities, but the session is labeled
    (offered by placement) only once the labeler has kept its labels in step: a reconnect
    without `nvml` is offered for nothing meanwhile, not for its previous session's labels."""
    await fleet.join(db, "n1")
    await fleet.say_hello(gateway, request(capabilities=["nvml"]))
    # the labeler's write for session 1: its label, and its capabilities at that epoch
    await db.execute(
        "INSERT INTO node_labels (node_id, key, value, source) VALUES ('n1', 'bc.dev/cap.nvml', '1', 'system')"
    )
    await db.execute("UPDATE node_sessions SET capabilities = '{nvml}' WHERE session_epoch = 1")
    assert await db.fetchval("SELECT array_agg(n) FROM nodes_with_capability('nvml') n") == ["n1"]
    await fleet.say_hello(gateway, request(boot_id="b2", capabilities=["cpu"]))
    row = await db.fetchrow("SELECT capabilities, session_epoch, labeled_epoch FROM node_sessions")
    assert (row["capabilities"], row["session_epoch"], row["labeled_epoch"]) == (["cpu"], 2, 1)
    assert await db.fetchval("SELECT count(*) FROM nodes_with_capability('nvml')") == 0


async def test_the_live_window_is_three_heartbeats_of_a_quiet_but_routed_row(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    """A session still routed to its gateway (never disconnected) is live for 30 s after it
    was last seen (3 heartbeat intervals of 10 s): another boot's Hello within them is a
    duplicate identity, past them it is not."""
    assert gateway.settings.live_window.total_seconds() == 30
    for node in ("quiet-29", "quiet-31"):
        await fleet.join(db, node)
        await fleet.say_hello(gateway, request(node_id=node, cert_serial=f"{node}-serial"))
    await db.execute(
        "UPDATE node_sessions SET last_seen = compute_now() - "
        "CASE node_id WHEN 'quiet-29' THEN interval '29 seconds' ELSE interval '31 seconds' END"
    )
    assert await db.fetchval(
        "SELECT bool_and(gateway_id = 'gw-a' AND disconnected_at IS NULL) FROM node_sessions"
    )
    for node in ("quiet-29", "quiet-31"):
        await fleet.say_hello(
            gateway, request(node_id=node, cert_serial=f"{node}-serial", boot_id="another-boot")
        )
    rows = await db.fetch(
        "SELECT node_id, previous_live FROM session_epochs WHERE epoch = 2 ORDER BY node_id"
    )
    assert [(r["node_id"], r["previous_live"]) for r in rows] == [
        ("quiet-29", True),
        ("quiet-31", False),
    ]
    held = await db.fetch("SELECT node_id FROM node_sessions WHERE held_epoch IS NOT NULL")
    assert [r["node_id"] for r in held] == ["quiet-29"]  # the duplicate identity is held


SIGNED_SPEC = {"sysctl": {"vm.swappiness": 10}}


async def _spec_after_welcome(gateway: Gateway, node: str) -> dict[str, object] | None:
    stream = RecordingStream()
    await fleet.say_hello(gateway, request(node_id=node, cert_serial=f"{node}-serial"), stream)

    async def followed() -> bool:
        return bool(stream.followed)

    await eventually(followed, what="what follows the Welcome")
    [(kind, desired)] = stream.followed
    assert kind == "desired"
    return dict(desired.spec)


async def test_the_spec_comes_in_the_hello_transaction_s_call_and_an_older_schema_reads_it_after(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    """The node's spec is read for the session the Hello opened, in the same call
    (`gateway_hello_desired`, migration 0063): one round trip, not two. Against a schema
    before it, the gateway makes the two calls, and the daemon gets the same."""
    for node in ("n1", "n2"):
        await fleet.join(db, node)
        await db.fetchval("SELECT set_node_spec($1, $2::jsonb)", node, json.dumps(SIGNED_SPEC))
    assert await _spec_after_welcome(gateway, "n1") == SIGNED_SPEC
    await db.execute(
        "DROP FUNCTION gateway_hello_desired(text, bigint, text, text, text, text, text, text, "
        "integer, text, boolean, bigint, bigint, text, interval, text, uuid, bigint, text, text, "
        "text[])"
    )
    assert await _spec_after_welcome(gateway, "n2") == SIGNED_SPEC
