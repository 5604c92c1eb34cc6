"""Who the reference gateway lets in, on real servers: each refusal code from real rows,
a serial with no record, a certificate naming another node, any capability list (a
Hello that cannot be published bumps nothing), a draining gateway, a node without a row.
What follows admission (the Hello transaction, the Welcome, a session's end):
test_gateway_hello.py."""

from __future__ import annotations

import json

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.gateway.hellos import request
from tests.integration.support import stream_messages
from workers.gateway import Code, Gateway, Refused


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
            await fleet.say_hello(gateway, hello)
        assert refused.value.code is code, hello
    welcome = await fleet.say_hello(gateway, request(cert_serial="n1-serial-new"))
    assert welcome.epoch == 1


async def test_a_serial_with_no_record_is_admitted_unrestricted(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")  # its recorded certificate restricts nothing either way
    await db.execute("UPDATE node_certs SET allowed_kinds = '{noop}'")
    welcome = await fleet.say_hello(gateway, request(cert_serial="not-recorded"))
    assert welcome.epoch == 1
    [fact] = await stream_messages(nc.jetstream(), subjects.facts_stream)
    cert = json.loads(fact.data)["cert"]
    assert cert == {"serial": "not-recorded", "allowed_kinds": None, "identity_generation": None}
    assert gateway.sessions["n1"].cert_not_after == float("inf")  # no expiry of record


async def test_a_certificate_naming_another_node_is_refused_recorded_or_not(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    """The certificate's own node id (its SPIFFE ID) is an input to admission for every
    serial: an unrecorded serial of n2 cannot claim n1 (docs/contract.md)."""
    await fleet.join(db, "n1")
    await fleet.join(db, "n2")
    for serial in ("not-recorded", "n1-serial"):
        with pytest.raises(Refused) as refused:
            await fleet.say_hello(gateway, request(cert_serial=serial, cert_node_id="n2"))
        assert refused.value.code is Code.PERMISSION_DENIED
    assert await db.fetchval("SELECT max(session_epoch) FROM node_sessions") == 0
    welcome = await fleet.say_hello(gateway, request(cert_node_id="n1"))
    assert welcome.epoch == 1


async def test_any_capability_list_connects_and_a_fact_that_cannot_be_published_bumps_nothing(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")
    caps = [f"cap-{i}" for i in range(2000)] + ["x" * 300]
    welcome = await fleet.say_hello(gateway, request(capabilities=caps))
    assert welcome.epoch == 1
    [fact] = [m for m in await stream_messages(nc.jetstream(), subjects.facts_stream)]
    import json

    assert len(json.loads(fact.data)["capabilities"]) == 2001
    with pytest.raises(Refused) as refused:  # a version no fact can carry (over 256 chars)
        await fleet.say_hello(gateway, request(boot_id="b2", daemon_version="9" * 300))
    assert refused.value.code is Code.INVALID_ARGUMENT
    assert "daemon_version" in str(refused.value)
    with pytest.raises(Refused) as refused:  # a digest that is not SHA-256 hex: not a CHECK error
        await fleet.say_hello(gateway, request(boot_id="b3", approver_set_sha256="XYZ"))
    assert refused.value.code is Code.INVALID_ARGUMENT
    assert "approver_set_sha256" in str(refused.value)
    assert await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n1'") == 1


async def test_a_draining_gateway_refuses_hellos_and_a_node_without_a_row_is_denied(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    await db.execute("UPDATE gateways SET draining = true WHERE gateway_id = 'gw-a'")
    with pytest.raises(Refused) as refused:
        await fleet.say_hello(gateway, request())
    assert refused.value.code is Code.UNAVAILABLE and refused.value.retry_after is not None
    assert gateway.alive  # draining is not a lost lease: its sessions stay
    await gateway.drain(False)  # the gateway itself takes Hellos again, and drains again
    assert not await db.fetchval("SELECT draining FROM gateways WHERE gateway_id = 'gw-a'")
    await gateway.drain()
    with pytest.raises(Refused) as refused:
        await fleet.say_hello(gateway, request())
    assert refused.value.code is Code.UNAVAILABLE
    await gateway.drain(False)
    await db.execute("DELETE FROM node_sessions WHERE node_id = 'n1'")
    with pytest.raises(Refused) as refused:
        await fleet.say_hello(gateway, request())
    assert refused.value.code is Code.PERMISSION_DENIED
    assert await db.fetchval("SELECT count(*) FROM session_epochs") == 0
