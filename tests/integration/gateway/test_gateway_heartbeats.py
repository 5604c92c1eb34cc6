"""What the reference gateway's heartbeats and inventory carry, on real servers: only
reported sections stored, whole, and a bounded number of them per node; the Welcome and
every 10th heartbeat ask for the sections not held; load and the applied generation
reach the flush; the fake daemon sends what is asked and tells a change. The sessions
themselves: test_gateway_sessions.py."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.facts import MAX_INVENTORY_SECTIONS, NodeLoad
from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.gateway.hellos import request
from tests.integration.support import eventually, stream_messages
from workers.gateway import Code, Gateway, Refused
from workers.sim.daemon import FakeDaemon


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
