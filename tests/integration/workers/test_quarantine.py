"""The quarantine enforcer on real servers, time moved with compute_now()."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Clock, Servers
from tests.integration import fleet
from tests.integration.driver import Driver, driving
from tests.integration.support import make_settings, running
from workers import quarantine


@pytest.fixture
async def drive(servers: Servers, nc: NATS, subjects: Subjects, database_url: str):  # type: ignore[no-untyped-def]
    async with driving(servers, nc, subjects, database_url, quarantine.build) as driver:
        yield driver


_epoch = iter(range(2, 10_000))
_turns: dict[str, int] = {}  # each node's clone Hellos so far: its gateway alternates


async def clone_hello(
    db: asyncpg.Connection,
    node: str = "n1",
    serial: str | None = "n1-serial",
    live: bool = True,
    gateways: tuple[str, str] = ("gw-1", "gw-2"),
) -> Any:
    """A Hello from the other machine while the first one's session was live: the two
    machines dial two gateways (`gateways`, by turns), and each epoch is issued to the one
    dialled by the Hello transaction, as a real gateway's would be."""
    epoch = next(_epoch)
    _turns[node] = _turns.get(node, 0) + 1
    gateway, other = gateways if _turns[node] % 2 else gateways[::-1]
    await fleet.issued(db, node, epoch, gateway)
    boots = ("boot-a", "boot-b") if epoch % 2 else ("boot-b", "boot-a")
    return fleet.hello(
        node,
        epoch,
        gateway_id=gateway,
        boot_id=boots[0],
        cert={"serial": serial},
        previous={
            "epoch": epoch - 1,
            "gateway_id": other,
            "boot_id": boots[1],
            "journal_id": "journal-1",
            "live": live,
        },
    )


async def _counter(db: asyncpg.Connection, node: str = "n1") -> tuple[int, Any]:
    row = await db.fetchrow(
        "SELECT duplicate_hellos, duplicate_since FROM node_sessions WHERE node_id = $1", node
    )
    return row["duplicate_hellos"], row["duplicate_since"]


async def _revoked(db: asyncpg.Connection) -> dict[str, str | None]:
    rows = await db.fetch("SELECT serial, revocation_reason FROM node_certs ORDER BY serial")
    return {r["serial"]: r["revocation_reason"] for r in rows}


async def test_three_alternations_do_not_quarantine_the_fourth_does(
    drive: Driver, db: asyncpg.Connection, clock: Clock
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await fleet.join(db, "n1", "n1-serial-2")  # a second, newer certificate
    await fleet.session(db, "other", epoch=1)
    for _ in range(3):
        await drive.send(await clone_hello(db, serial="n1-serial-2"))
        await clock.advance(timedelta(minutes=3))
    assert (await _counter(db))[0] == 3
    assert all(reason is None for reason in (await _revoked(db)).values())
    await drive.send(await clone_hello(db, serial="n1-serial-2"))  # 9 minutes after the first
    assert await _revoked(db) == {
        "n1-serial": None,
        "n1-serial-2": "duplicate-identity",
        "other-serial": None,
    }
    assert await db.fetchval("SELECT is_revoked('n1-serial-2')") is True
    assert await quarantine.is_revoked(db, "n1-serial") is False
    assert await _counter(db) == (0, None)  # reset: a re-joined machine starts afresh
    dups = await drive.published("security.node.duplicate-session")
    assert [(d["alternations"], d["quarantined"]) for d in dups] == [
        (1, False),
        (2, False),
        (3, False),
        (4, True),
    ]
    assert {d["windowSeconds"] for d in dups} == {600}
    [event] = await drive.published("security.node.quarantined")
    assert event == {
        **event,
        "nodeId": "n1",
        "reason": "duplicate-identity",
        "alternations": 4,
        "revokedSerials": ["n1-serial-2"],
    }
    revocations = await drive.published("revocations")
    assert [(r["nodeId"], r["serials"], r["_subject"]) for r in revocations] == [
        ("n1", ["n1-serial-2"], drive.subjects.revocations)
    ]


async def test_four_spread_over_eleven_minutes_do_not(
    drive: Driver, db: asyncpg.Connection, clock: Clock
) -> None:
    await fleet.session(db, "n1", epoch=1)
    for _ in range(4):
        await drive.send(await clone_hello(db))
        await clock.advance(timedelta(minutes=3, seconds=40))
    assert (await _counter(db))[0] == 1  # the 4th came 11 minutes after the 1st: a new window
    assert await _revoked(db) == {"n1-serial": None}


async def test_a_quiet_prior_session_is_not_a_duplicate(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    for _ in range(5):
        await drive.send(await clone_hello(db, live=False))
    assert await _counter(db) == (0, None)
    assert drive.settled("ignored") == 5
    assert await drive.published("security.node.duplicate-session") == []


async def test_no_serial_revokes_every_live_certificate_of_the_node_only(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await fleet.join(db, "n1", "n1-b")
    await fleet.join(db, "n1", "n1-c")
    await db.execute(
        "UPDATE node_certs SET revoked_at = now() - interval '1 day', revocation_reason = 'rotated' WHERE serial = 'n1-b'"
    )
    await fleet.session(db, "n2", epoch=1)
    await drive.send(*[await clone_hello(db, serial=None) for _ in range(4)])
    assert await _revoked(db) == {
        "n1-b": "rotated",  # already revoked: untouched
        "n1-c": "duplicate-identity",
        "n1-serial": "duplicate-identity",
        "n2-serial": None,
    }
    [event] = await drive.published("security.node.quarantined")
    assert event["revokedSerials"] == ["n1-c", "n1-serial"]


async def test_the_counter_restarts_after_a_quarantine(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await drive.send(*[await clone_hello(db, serial=None) for _ in range(4)])
    await fleet.join(db, "n1", "n1-rejoined")
    await drive.send(*[await clone_hello(db, serial="n1-rejoined") for _ in range(3)])
    assert (await _counter(db))[0] == 3
    assert (await _revoked(db))["n1-rejoined"] is None


async def test_a_redelivered_hello_does_not_count_twice(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """No inbox: an epoch is counted once, so the same Hello again (a re-publish outside
    the duplicate window, JetStream stores it), even after a newer alternation, finds its
    epoch counted and does nothing."""
    await fleet.session(db, "n1", epoch=1)
    hello = await clone_hello(db)
    await drive.send(hello)
    await drive.send(hello, again=True)
    assert (await _counter(db))[0] == 1
    newer = await clone_hello(db)
    await drive.send(newer)
    await drive.send(hello, again=True)  # the first one again, after the second was counted
    assert (await _counter(db))[0] == 2
    assert drive.settled("duplicate") == 2 and drive.settled("foreign") == 0
    events = await drive.published("security.node.duplicate-session")
    assert [e["alternations"] for e in events] == [1, 2]  # one event per counted epoch
    assert await db.fetchval("SELECT count(*) FROM processed_facts") == 0


async def test_another_hello_fact_of_a_counted_epoch_is_foreign(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """Two Hello facts of one epoch (a gateway that records no Hello fact id: an older
    release, unchecked by provenance): the second, with its own fact id, counts nothing."""
    await fleet.session(db, "n1", epoch=1)
    hello = await clone_hello(db)
    await drive.send(hello)
    second = hello.model_copy(update={"fact_id": uuid.uuid4(), "boot_id": "boot-c"})
    await drive.send(second)
    assert (await _counter(db))[0] == 1
    assert drive.settled("foreign") == 1
    assert len(await drive.published("security.node.duplicate-session")) == 1


async def test_two_replicas_count_each_hello_once(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    settings = make_settings(servers.nats_url, database_url, subjects, batch_size=1)
    async with (
        running(settings, [quarantine.build(settings)]) as (one, _),
        running(settings, [quarantine.build(settings)]) as (two, _),
    ):
        driver = Driver(nc, subjects, one, "quarantine", database_url)
        hellos = [await clone_hello(db, serial=None) for _ in range(7)]
        js = nc.jetstream()
        from tests.integration.support import eventually, publish_fact

        for hello in hellos:
            await publish_fact(js, subjects, hello)

        async def all_settled() -> bool:
            total = sum(
                v
                for m in (one, two)
                for (w, _t, _o), v in m.metrics.facts.by_labels().items()
                if w == "quarantine"
            )
            return total >= 7

        await eventually(all_settled, what="7 Hellos settled by two replicas")
        dups = await driver.published("security.node.duplicate-session")
    # one event per Hello, one quarantine; the numbers are the Hellos' own in epoch order
    # (two replicas may apply them out of order: a late one reads as of its Hello)
    assert len(dups) == 7
    assert sum(d["quarantined"] for d in dups) == 1
    assert (await _counter(db))[0] == 3


async def _held(db: asyncpg.Connection) -> Any:
    return await db.fetchval("SELECT held_epoch FROM node_sessions WHERE node_id = 'n1'")


async def test_a_counted_hello_releases_its_session_a_quarantining_one_keeps_it_held(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    for _ in range(3):
        hello = await clone_hello(db, serial=None)
        await db.execute(
            "UPDATE node_sessions SET session_epoch = $1, held_epoch = $1, gateway_id = $2",
            hello.epoch,
            hello.gateway_id,
        )  # as the Hello transaction of a duplicate leaves it
        await drive.send(hello)
        assert await _held(db) is None  # counted, not quarantined: released
    hello = await clone_hello(db, serial=None)
    await db.execute(
        "UPDATE node_sessions SET session_epoch = $1, held_epoch = $1, gateway_id = $2",
        hello.epoch,
        hello.gateway_id,
    )
    await drive.send(hello)  # the fourth: quarantined
    assert await _held(db) == hello.epoch  # the clone's session never gets a command


async def test_a_backlog_counts_each_alternation_as_of_its_hello(
    drive: Driver, db: asyncpg.Connection, clock: Clock
) -> None:
    """Alternations timed by the Hellos (docs/contract.md): five alternating Hellos whose
    epochs were issued 4 minutes apart (never more than 3 within 10 minutes), applied in
    one backlog 16 minutes after the first, quarantine nothing; the same five issued a
    minute apart do, at the 4th, as before."""
    await fleet.session(db, "n1", epoch=1)
    await fleet.session(db, "n2", epoch=1)
    spread, close = [], []
    for _ in range(5):
        spread.append(await clone_hello(db, "n1", "n1-serial"))
        close.append(await clone_hello(db, "n2", "n2-serial"))
        await clock.advance(timedelta(minutes=4) if len(close) > 4 else timedelta(minutes=1))
    # n1's epochs 4 minutes apart: issue them again at those times
    for i, hello in enumerate(spread):
        await db.execute(
            "UPDATE session_epochs SET issued_at = compute_now() - $3::interval "
            "WHERE node_id = $1 AND epoch = $2",
            "n1",
            hello.epoch,
            timedelta(minutes=4 * (4 - i)),
        )
    await drive.send(*spread, *close)
    dups = await drive.published("security.node.duplicate-session")
    assert [(d["alternations"], d["quarantined"]) for d in dups if d["nodeId"] == "n1"] == [
        (1, False),
        (2, False),
        (3, False),
        (1, False),
        (2, False),
    ]
    assert [(d["alternations"], d["quarantined"]) for d in dups if d["nodeId"] == "n2"] == [
        (1, False),
        (2, False),
        (3, False),
        (4, True),
        (1, False),
    ]
    assert await _revoked(db) == {"n1-serial": None, "n2-serial": "duplicate-identity"}


async def test_alternations_applied_out_of_order_count_in_epoch_order(
    drive: Driver, db: asyncpg.Connection, clock: Clock
) -> None:
    """The 4th alternation within the window quarantines even when the facts arrive in
    reverse order; a second Hello fact of an epoch already counted counts nothing."""
    await fleet.session(db, "n1", epoch=1)
    hellos = []
    for _ in range(4):
        hellos.append(await clone_hello(db))
        await clock.advance(timedelta(minutes=2))
    await drive.send(hellos[3], hellos[2])
    other = hellos[2].model_copy(update={"fact_id": uuid.uuid4(), "boot_id": "boot-c"})
    await drive.send(other)  # another Hello fact of an epoch counted: foreign, not counted
    assert drive.settled("foreign") == 1
    await drive.send(hellos[1], hellos[0])
    assert (await _revoked(db))["n1-serial"] == "duplicate-identity"
    dups = await drive.published("security.node.duplicate-session")
    assert len(dups) == 4 and sum(d["quarantined"] for d in dups) == 1
