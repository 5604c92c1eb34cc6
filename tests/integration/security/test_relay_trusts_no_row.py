"""The relay trusts no row (issue #41, "the relay, the dead letters, the quotas, the
grants"): as the labeler's own database login, an attacker writes outbox packs the
row-level security lets it write — its worker is `labeler` — holding a shell command for
a node, a forged quarantine, a revocation, and a pack whose headers are not JSON, beside
the labeler's genuine event. A dedicated relay (every worker's rows) publishes the
genuine event and buries each forgery alone, with its reason; nothing forged reaches the
bus, and the round goes on."""

from __future__ import annotations

import json
import time
import uuid

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from opentelemetry import trace

from schemas import REGISTRY
from schemas.events import CapabilitiesChanged, Quarantined, Revocations
from schemas.notices import Dispatch
from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.support import stream_messages
from workers.runtime.base.runtime_settings import DatabaseSettings, OutboxSettings
from workers.runtime.bus import deadletter, sendable, streams
from workers.runtime.effects.outbox import OutboxRelay
from workers.runtime.observability.metrics import Metrics


def _message(message: object, subject: str) -> tuple[str, str, bytes]:
    body, headers = REGISTRY.encode(message)  # type: ignore[arg-type]
    return subject, json.dumps(headers), body


async def _pack(conn: asyncpg.Connection, *messages: tuple[str, str, bytes]) -> None:
    await conn.execute(
        "INSERT INTO outbox_packs (worker, size, msg_ids, subjects, headers, bodies, order_keys) "
        "VALUES ('labeler', $1, $2, $3, $4, $5, $6)",
        len(messages),
        [uuid.uuid4() for _ in messages],
        [m[0] for m in messages],
        [m[1] for m in messages],
        [m[2] for m in messages],
        ["n1" for _ in messages],
    )


async def test_a_workers_login_gets_nothing_published_that_the_worker_could_not_send(
    logins: dict[str, str], nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    await fleet.join(db, "n1")
    command = uuid.uuid4()
    shell = Dispatch(
        node_id="n1",
        epoch=1,
        command_id=command,
        seq=1,
        kind="shell.exec",
        lane="default",
        attempt=1,
        payload={"cmd": "id; cat /etc/shadow"},
        signature=None,
    )
    genuine = CapabilitiesChanged(node_id="n1", epoch=1, added=["gpu"], removed=[])
    labeler = await asyncpg.connect(logins["bcw_labeler"])
    try:  # all of it allowed to the labeler's login by the row-level security
        await _pack(labeler, _message(shell, subjects.notice("gw-1", "dispatch")))
        await _pack(
            labeler,
            _message(
                Quarantined(node_id="n1", reason="x", alternations=4, revoked_serials=[]),
                subjects.event("security.node.quarantined"),
            ),
            _message(
                Revocations(node_id="n1", serials=["n1-serial"], reason="x"), subjects.revocations
            ),
        )
        await _pack(labeler, (subjects.event("node.capabilities-changed"), "not json{", b"{}"))
        await _pack(
            labeler, (subjects.event("node.capabilities-changed"), '["traceparent"]', b"{}")
        )
        # its own event, to a subject it does not send it to (upper case, another type's)
        await _pack(labeler, _message(genuine, subjects.event("node.capabilities-changed").upper()))
        await _pack(labeler, _message(genuine, subjects.event("node.capabilities-changed")))
    finally:
        await labeler.close()
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    relay = OutboxRelay(
        pool,
        js,
        OutboxSettings(),
        DatabaseSettings(url=database_url),
        Metrics(),
        trace.NoOpTracer(),
        subjects,
    )
    try:
        await relay.flush(time.monotonic() + 20)
    finally:
        await pool.close()
    assert await db.fetchval("SELECT count(*) FROM outbox_packs") == 0  # nothing stuck
    reasons = sorted(r["reason"] for r in await db.fetch("SELECT reason FROM outbox_dead"))
    unparsed = [r for r in reasons if r.startswith("its headers do not parse")]
    assert len(unparsed) == 1
    assert sorted(set(reasons) - set(unparsed)) == sorted(
        [
            "worker labeler does not send 'dispatch'",
            "worker labeler does not send 'security.node.quarantined'",
            "worker labeler does not send 'revocations'",
            "its headers are not a map",
            f"worker labeler does not send node.capabilities-changed to "
            f"{subjects.event('node.capabilities-changed').upper()}",
        ]
    )
    kept = await db.fetchval(
        "SELECT headers FROM outbox_dead WHERE reason LIKE 'its headers do not parse%'"
    )
    assert json.loads(kept) == {"unparsed": "not json{"}  # kept whole for an operator
    events = [m.headers["Bc-Type"] for m in await stream_messages(js, subjects.events_stream)]
    assert events == ["node.capabilities-changed"]  # the genuine one, once
    assert await stream_messages(js, subjects.gateway_stream) == []  # no dispatch, to anyone
    letters = await deadletter.list_dead_letters(js, subjects, "relay")
    assert len(letters) == 6 and {letter.cause for letter in letters} == {"forged"}
    assert all("Bc-Type" not in (letter.headers or {}) for letter in letters)


@pytest.mark.parametrize("owners", [None, ["labeler"]], ids=["dedicated", "in-the-worker"])
async def test_a_row_that_would_stop_the_relay_is_buried_alone_and_slows_nobody(
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    owners: list[str] | None,
) -> None:
    """Issue #59, finding 5: as the labeler's login, a pack whose `Bc-Type` is a list (it
    raised TypeError out of every round: no row of any worker went out) and one with a
    `Nats-Rollup: all` header (answered 500, retried for ever, every round backed off), and
    one whose headers nest past the JSON parser (a RecursionError), between genuine events. Each is buried alone with its reason, at once, and said on the
    relay's dead letters (a dedicated relay's, or the labeler's own where the worker
    relays); every genuine event goes out in the first round."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    genuine = _message(
        CapabilitiesChanged(node_id="n1", epoch=1, added=["gpu"], removed=[]),
        subjects.event("node.capabilities-changed"),
    )
    subject, headers, body = genuine
    listed = json.dumps({**json.loads(headers), "Bc-Type": ["node.capabilities-changed"]})
    rollup = json.dumps({**json.loads(headers), "Nats-Rollup": "all"})
    # nested past the JSON parser's recursion: a RecursionError stopped every round
    nested = headers[:-1] + ', "baggage": ' + "[" * 3000 + "]" * 3000 + "}"
    labeler = await asyncpg.connect(logins["bcw_labeler"])
    try:
        await _pack(labeler, genuine, (subject, listed, body), genuine)
        await _pack(labeler, (subject, rollup, body), genuine, (subject, nested, body))
    finally:
        await labeler.close()
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    relay = OutboxRelay(
        pool,
        js,
        OutboxSettings(),
        DatabaseSettings(url=database_url),
        Metrics(),
        trace.NoOpTracer(),
        subjects,
        owners=owners,
    )
    try:
        assert await relay.publish_round() == 6  # no exception: the round goes on
    finally:
        await pool.close()
    letters = await deadletter.list_dead_letters(js, subjects, "labeler" if owners else "relay")
    assert len(letters) == 3 and {letter.cause for letter in letters} == {"forged"}
    assert await db.fetchval("SELECT count(*) FROM outbox_packs") == 0
    reasons = sorted(r["reason"] for r in await db.fetch("SELECT reason FROM outbox_dead"))
    assert reasons == [
        "header 'Nats-Rollup' is not one a worker sends",
        "header Bc-Type is not a string (list)",
        "its headers do not parse: nested too deep",
    ]
    events = await stream_messages(js, subjects.events_stream)
    assert [m.headers["Bc-Type"] for m in events] == ["node.capabilities-changed"] * 3


async def test_a_row_the_server_refuses_is_tried_three_times_and_slows_nobody(
    nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    """A row the server answers with an error of its own (a relay told to let `Nats-Rollup`
    through, which the events stream refuses with a 500): no round raises (no back-off),
    the genuine rows beside it go out in its first round, and the third refusal buries it."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    subject, headers, body = _message(
        CapabilitiesChanged(node_id="n1", epoch=1, added=["gpu"], removed=[]),
        subjects.event("node.capabilities-changed"),
    )
    rollup = json.dumps({**json.loads(headers), "Nats-Rollup": "all"})
    await _pack(db, (subject, rollup, body), (subject, headers, body), (subject, headers, body))
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    relay = OutboxRelay(
        pool,
        js,
        OutboxSettings(),
        DatabaseSettings(url=database_url),
        Metrics(),
        trace.NoOpTracer(),
        subjects,
        headers=sendable.HEADERS | {"Nats-Rollup"},
    )
    try:
        started = time.monotonic()
        assert await relay.publish_round() == 2  # the others, at once; no OutboxPublishError
        assert await relay.publish_round() == 0  # refused again: left, not raised
        assert await db.fetchval("SELECT size FROM outbox_packs") == 1
        assert await relay.publish_round() == 1  # the third refusal: buried
        assert time.monotonic() - started < 3.0  # no publish timeout, no back-off
    finally:
        await pool.close()
    assert await db.fetchval("SELECT count(*) FROM outbox_packs") == 0
    [reason] = [r["reason"] for r in await db.fetch("SELECT reason FROM outbox_dead")]
    assert reason.startswith("the server refused it 3 times: ServerError"), reason
    events = await stream_messages(js, subjects.events_stream)
    assert len(events) == 2
