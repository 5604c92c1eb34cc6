"""The capability labeler on real servers (DESIGN §6, issue: capability labeler)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.driver import Driver, driving, fetch
from tests.integration.support import eventually, publish_fact
from workers import labeler
from workers.labeler import apply
from workers.runtime.effects.worker import Tx


@pytest.fixture
async def drive(servers: Servers, nc: NATS, subjects: Subjects, database_url: str):  # type: ignore[no-untyped-def]
    async with driving(servers, nc, subjects, database_url, labeler.build) as driver:
        yield driver


async def _caps(db: asyncpg.Connection, node: str) -> list[str]:
    return list(
        await db.fetchval("SELECT capabilities FROM node_sessions WHERE node_id = $1", node)
    )


async def _labels(db: asyncpg.Connection, node: str) -> list[tuple[str, str, str]]:
    rows = await db.fetch(
        "SELECT key, value, source FROM node_labels WHERE node_id = $1 ORDER BY source, key", node
    )
    return [tuple(r) for r in rows]


async def test_labels_follow_each_session_and_events_report_changes(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await drive.send(fleet.hello("n1", 1, capabilities=["nvml", "cuda.12", "nvml"]))
    assert await _caps(db, "n1") == ["cuda.12", "nvml"]
    assert await _labels(db, "n1") == [
        ("bc.dev/cap.cuda.12", "1", "system"),
        ("bc.dev/cap.nvml", "1", "system"),
    ]
    # a later session drops nvml: its label goes with it, at that session
    await fleet.session(db, "n1", epoch=2)
    await drive.send(fleet.hello("n1", 2, capabilities=["cuda.12"]))
    assert await _labels(db, "n1") == [("bc.dev/cap.cuda.12", "1", "system")]
    # the same set again: nothing changes, no event
    await fleet.session(db, "n1", epoch=3)
    await drive.send(fleet.hello("n1", 3, capabilities=["cuda.12"]))
    events = await drive.published("node.capabilities-changed")
    assert [(e["epoch"], e["added"], e["removed"]) for e in events] == [
        (1, ["cuda.12", "nvml"], []),
        (2, [], ["nvml"]),
    ]


async def test_a_hello_with_2000_capabilities_and_a_300_character_name_labels_64(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    names = [f"cap-{i:04d}" for i in range(2000)] + ["x" * 300, "Not Valid", ""]
    await drive.send(fleet.hello("n1", 1, capabilities=names))
    assert drive.settled("applied") == 1 and drive.settled("dead") == 0
    assert await _caps(db, "n1") == [f"cap-{i:04d}" for i in range(64)]
    assert len(await _labels(db, "n1")) == 64


async def test_an_older_hello_processed_after_a_newer_one_changes_nothing(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=5)
    await drive.send(fleet.hello("n1", 5, capabilities=["new"]))
    await drive.send(fleet.hello("n1", 4, capabilities=["old", "stale"]))
    assert await _caps(db, "n1") == ["new"]
    assert await _labels(db, "n1") == [("bc.dev/cap.new", "1", "system")]
    assert drive.settled("stale") == 1
    assert len(await drive.published("node.capabilities-changed")) == 1


async def test_operator_labels_are_never_touched_and_never_count(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await fleet.session(db, "n2", epoch=1)
    await db.execute(
        "INSERT INTO node_labels VALUES ('n1', 'bc.dev/cap.nvml', '1', 'operator'), "
        "('n2', 'bc.dev/cap.nvml', '1', 'operator'), ('n2', 'team', 'ml', 'operator')"
    )
    await drive.send(
        fleet.hello("n1", 1, capabilities=[]), fleet.hello("n2", 1, capabilities=["nvml"])
    )
    assert await db.fetch("SELECT * FROM nodes_with_capability('nvml')") == [("n2",)]
    # n2 stops advertising it: its system label goes, its operator labels stay
    await fleet.session(db, "n2", epoch=2)
    await drive.send(fleet.hello("n2", 2, capabilities=[]))
    assert await db.fetch("SELECT * FROM nodes_with_capability('nvml')") == []
    assert await _labels(db, "n2") == [
        ("bc.dev/cap.nvml", "1", "operator"),
        ("team", "ml", "operator"),
    ]
    assert await _labels(db, "n1") == [("bc.dev/cap.nvml", "1", "operator")]


async def test_invalid_names_are_dropped_and_the_65th_is_not_stored(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    caps = ["BAD NAME", "ok", "-nope", *[f"c{i:02d}" for i in range(70)]]
    await drive.send(fleet.hello("n1", 1, capabilities=caps))
    stored = await _caps(db, "n1")
    assert len(stored) == 64 and "ok" not in stored  # "ok" sorts after c00…c69
    assert stored == sorted(stored) and stored[0] == "c00" and stored[-1] == "c63"
    assert len(await _labels(db, "n1")) == 64


async def test_a_hello_delivered_again_changes_nothing_the_second_time(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """No inbox: the labeler's effects are idempotent by construction. The same Hello
    again (a re-publish outside the duplicate window, so JetStream stores it) reaches the
    rules and finds nothing to do: the same capabilities, labels and one event; and no
    inbox row is written."""
    await fleet.session(db, "n1", epoch=1)
    first = fleet.hello("n1", 1, capabilities=["nvml"])
    await drive.send(first)
    before = (await _caps(db, "n1"), await _labels(db, "n1"))
    await drive.send(first, again=True)
    assert (await _caps(db, "n1"), await _labels(db, "n1")) == before
    assert len(await drive.published("node.capabilities-changed")) == 1
    assert drive.settled("applied") == 2
    assert await db.fetchval("SELECT count(*) FROM processed_facts") == 0


async def test_a_hello_redelivered_after_a_newer_one_changes_nothing(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    older = fleet.hello("n1", 1, capabilities=["nvml", "old"])
    await drive.send(older)
    await fleet.session(db, "n1", epoch=2)
    await drive.send(fleet.hello("n1", 2, capabilities=["nvml"]))
    after = (await _caps(db, "n1"), await _labels(db, "n1"))
    await drive.send(older, again=True)  # the epoch-1 Hello once more, after epoch 2's
    assert (
        (await _caps(db, "n1"), await _labels(db, "n1"))
        == after
        == (["nvml"], [("bc.dev/cap.nvml", "1", "system")])
    )
    assert drive.settled("stale") == 1
    assert len(await drive.published("node.capabilities-changed")) == 2


async def test_one_hello_applied_by_two_replicas_at_once_makes_one_event(
    db: asyncpg.Connection, database_url: str, subjects: Subjects
) -> None:
    """A redelivery to another replica while the first still holds the fact: the second
    transaction waits for the first's row locks, then reads what it committed and finds
    nothing to do — one write of the labels, one event."""
    await fleet.session(db, "n1", epoch=1)
    hello = fleet.hello("n1", 1, capabilities=["nvml", "ib"])
    first, second = await asyncpg.connect(database_url), await asyncpg.connect(database_url)
    try:
        tx1 = first.transaction()
        await tx1.start()
        one = Tx(first, subjects, {}, worker="labeler")
        await apply.handle(one, [hello])  # holds n1's row lock until it commits
        tx2 = second.transaction()
        await tx2.start()
        two = Tx(second, subjects, {}, worker="labeler")
        waiting = asyncio.create_task(apply.handle(two, [hello]))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # blocked on the lock, not deciding on what it read
        await tx1.commit()
        await waiting
        await tx2.commit()
    finally:
        await first.close()
        await second.close()
    assert [len(one.outbox.rows), len(two.outbox.rows)] == [1, 0]
    assert await _labels(db, "n1") == [
        ("bc.dev/cap.ib", "1", "system"),
        ("bc.dev/cap.nvml", "1", "system"),
    ]


async def test_a_batch_of_many_nodes_is_labeled(drive: Driver, db: asyncpg.Connection) -> None:
    await db.execute(
        "SELECT join_node('b' || i, 'worker', 'b-serial-' || i, NULL) FROM generate_series(1, 300) i"
    )
    await db.execute("UPDATE node_sessions SET session_epoch = 1, gateway_id = 'gw-1'")
    await drive.send(
        *(fleet.hello(f"b{i}", 1, capabilities=["x", f"only{i % 3}"]) for i in range(1, 301))
    )
    rows = await fetch(
        drive.database_url, "SELECT count(*) AS n FROM node_labels WHERE source = 'system'"
    )
    assert rows[0]["n"] == 600
    assert len(await db.fetch("SELECT * FROM nodes_with_capability('only0')")) == 100


async def _offered(db: asyncpg.Connection, *capabilities: str) -> dict[str, list[str]]:
    return {
        cap: [r["n"] for r in await db.fetch("SELECT n FROM nodes_with_capability($1) n", cap)]
        for cap in capabilities
    }


async def test_a_reconnect_is_offered_only_for_what_its_own_session_advertises(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    """Placement as of the Hello (docs/contract.md): the labeler stops between two Hellos
    of a node, the second without `nvml`; until it is back the node is offered for
    nothing, then for what its current session advertises."""
    await fleet.session(db, "n1", epoch=1)
    async with driving(servers, nc, subjects, database_url, labeler.build) as drive:
        await drive.send(fleet.hello("n1", 1, capabilities=["nvml", "cuda.12"]))
        assert await _offered(db, "nvml", "cuda.12") == {"nvml": ["n1"], "cuda.12": ["n1"]}
    # the labeler is down (or behind) when the node reconnects without nvml
    await fleet.session(db, "n1", epoch=2)
    await publish_fact(nc.jetstream(), subjects, fleet.hello("n1", 2, capabilities=["cuda.12"]))
    assert await _offered(db, "nvml", "cuda.12") == {"nvml": [], "cuda.12": []}
    async with driving(servers, nc, subjects, database_url, labeler.build):

        async def labeled() -> bool:
            return await _offered(db, "nvml", "cuda.12") == {"nvml": [], "cuda.12": ["n1"]}

        await eventually(labeled, what="the restarted labeler's labels of session 2")


async def test_a_batch_reads_its_nodes_labels_by_node_even_before_the_first_analyze(
    db: asyncpg.Connection,
) -> None:
    """A fleet's first power-on: `node_labels` empty and never analyzed. The batch read's
    plan, made then and kept by its prepared statement, goes to each node's labels through
    the primary key — not through the placement index (key, node_id), which it searched
    once per distinct key, PostgreSQL's largest cost in a herd until the first ANALYZE."""
    reltuples = await db.fetchval("SELECT reltuples FROM pg_class WHERE relname = 'node_labels'")
    assert reltuples == -1  # never analyzed: what the planner sees on a fresh install
    await db.execute("SET plan_cache_mode = force_generic_plan")
    explain = await db.prepare(f"EXPLAIN {apply.READ_ROWS}")
    plan = "\n".join(row[0] for row in await explain.fetch(["n1", "n2"], 12))
    assert "node_labels_pkey" in plan, plan
    assert "node_labels_system_by_key" not in plan, plan
