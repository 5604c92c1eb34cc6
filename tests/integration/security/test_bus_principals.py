"""The bus principals on a real nats-server that includes the generated `auth.conf`:
nobody unauthenticated gets in; `admin` provisions; each worker runs as its own
`worker-*` principal and does its work end to end with a gateway logged in as
`gateway-gw-1`; no principal gets a right it was not given."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import asyncpg
import nats
import nats.js.errors
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from schemas import REGISTRY
from tests.conftest import Servers
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.security.conftest import SUBJECTS, client_as, nats_as, violated
from tests.integration.streams import RecordingStream
from tests.integration.support import bcw, eventually, make_settings, running
from workers.embedded.servers import EmbeddedNats
from workers.gateway import Gateway, HelloRequest
from workers.registry import WORKERS
from workers.runtime.base.errors import RefusedError
from workers.runtime.base.runtime_settings import NatsSettings
from workers.runtime.bus import connection, deadletter, frames

pytestmark = pytest.mark.slow


async def test_nobody_unauthenticated_gets_in(secured: str) -> None:
    with pytest.raises(RefusedError) as refused:
        await connection.connect(NatsSettings(url=secured, connect_timeout=2.0), name="anonymous")
    assert refused.value.setting == "BCW_NATS_URL"


async def test_each_worker_principal_keeps_the_fast_path(keys: Path, secured: str) -> None:
    """Its start's probe publishes to its own inbox: a worker's grants allow it, so a
    least-privilege worker writes its acks and batches at once, as a trusted one does."""
    for name in WORKERS:
        nc = await connection.connect(nats_as(keys, secured, f"worker-{name}"), name=name)
        try:
            assert await frames.verify(nc), name
        finally:
            await nc.close()


async def test_under_an_auth_conf_of_0_3_a_worker_takes_the_public_api_and_lives_on(
    keys: Path, tmp_path: Path
) -> None:
    """0.3's `auth.conf` gave no principal its own inbox to publish to: the probe is
    refused, the worker keeps its connection and publishes one message at a time."""
    old = keys / "auth.conf"
    conf = tmp_path / "auth-0.3.conf"
    conf.write_text(
        re.sub(
            r'publish: \{ allow: \["_INBOX\.[A-Z0-9]+\.>", ', "publish: { allow: [", old.read_text()
        )
    )
    assert conf.read_text().count('publish: { allow: ["_INBOX') == 0
    (tmp_path / "server.conf").write_text(f'include "{conf.name}"\n')
    server = EmbeddedNats(tmp_path / "nats", extra=["-c", str(tmp_path / "server.conf")]).start()
    refused: list[str] = []
    try:
        nc = await connection.connect(
            nats_as(keys, server.url, "worker-labeler"),
            name="labeler",
            on_publish_refused=refused.append,
        )
        try:
            assert not await frames.verify(nc, within=1.0)
            assert nc.is_connected and refused and refused[0].startswith("_inbox.")
            await nc.jetstream().account_info()  # the connection still serves the worker
        finally:
            await nc.close()
    finally:
        server.stop()


async def test_a_seed_that_is_not_one_names_its_setting(tmp_path: Path, secured: str) -> None:
    bogus = tmp_path / "bogus.nk"
    bogus.write_text("not a seed\n")
    code, output = await bcw("provision", BCW_NATS_URL=secured, BCW_NATS_NKEY_SEED_FILE=str(bogus))
    assert code == 2 and "BCW_NATS_NKEY_SEED_FILE" in output and "Traceback" not in output


async def test_each_principal_does_its_work_and_nothing_else(
    keys: Path, secured: str, servers: Servers, database_url: str, db: asyncpg.Connection
) -> None:
    # admin provisions the streams and consumers: the workers', gw-1's and gw-2's notices
    # consumers and the dashboards' durable (none of those principals may make its own)
    code, output = await bcw(
        "provision",
        BCW_NATS_URL=secured,
        BCW_NATS_NKEY_SEED_FILE=str(keys / "admin.nk"),
        BCW_NATS_GATEWAYS="gw-1,gw-2",
        BCW_NATS_SUBSCRIBERS="dashboards",
        # the workers' consumer settings (`make_settings`): they bind what it makes
        BCW_CONSUMER_ACK_WAIT="5s",
        BCW_DATABASE_COMMAND_TIMEOUT="4s",
    )
    assert code == 0 and "consumer sub-dashboards" in output, output

    # the five workers, each as its own principal; a gateway as gateway-gw-1
    base = make_settings(secured, database_url, SUBJECTS)
    workers = [
        base.model_copy(update={"nats": nats_as(keys, secured, f"worker-{name}")})
        for name in WORKERS
    ]
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    gateway_nc = await connection.connect(nats_as(keys, secured, "gateway-gw-1"), name="gw-1")
    gateway = Gateway("gw-1", pool, gateway_nc, SUBJECTS)
    async with contextlib.AsyncExitStack() as stack:
        for settings, name in zip(workers, WORKERS, strict=True):
            await stack.enter_async_context(running(settings, [WORKERS[name](settings)]))
        await gateway.start()
        try:
            await fleet.join(db, "n1")
            command = await db.fetchval("SELECT enqueue_command('n1', 'noop', '{}')")
            stream = RecordingStream()
            await fleet.say_hello(
                gateway,
                HelloRequest(
                    node_id="n1",
                    cert_serial="n1-serial",
                    role="worker",
                    boot_id="b1",
                    journal_id="j1",
                    capabilities=["gpu"],
                ),
                stream,
            )
            await eventually(lambda: _one(stream), what="the command delivered through gw-1")
            assert stream.delivered[0].command_id == command
            await eventually(lambda: _labeled(db), what="the labeler's system label")

            # subscriber reads the events, and may do nothing else: no consumer of any kind
            # (none to create, change or delete), no publish
            async with client_as(keys, secured, "subscriber") as (nc, errors):
                js = nc.jetstream(timeout=2.0)

                async def connected() -> bool:  # relayed by the liveness worker in its time
                    with contextlib.suppress(nats.js.errors.NotFoundError):
                        first = await js.get_msg(
                            SUBJECTS.events_stream,
                            seq=1,
                            next=True,
                            subject=SUBJECTS.event("node.connected"),
                        )
                        return bool(first.headers and first.headers["Bc-Type"] == "node.connected")
                    return False

                await eventually(connected, what="node.connected read by the subscriber")
                await nc.publish(SUBJECTS.fact("gw-1", "hello"), b"{}")
                await nc.flush()
                await eventually(lambda: violated(errors, "Publish"), what="a refused publish")
                for config in (
                    ConsumerConfig(deliver_policy=DeliverPolicy.ALL),  # ephemeral
                    ConsumerConfig(durable_name="mine", deliver_policy=DeliverPolicy.ALL),
                    ConsumerConfig(name="spy", deliver_subject="bc.facts.gw-1.hello"),
                ):
                    errors.clear()
                    with pytest.raises(nats.errors.TimeoutError):  # refused: no answer
                        await js.add_consumer(SUBJECTS.events_stream, config)
                    await eventually(lambda: violated(errors, "Publish"), what="refused")
                with pytest.raises(nats.errors.TimeoutError):
                    await js.delete_consumer(SUBJECTS.events_stream, "sub-dashboards")
                with pytest.raises(nats.errors.TimeoutError):  # nor pulls from any
                    await js.consumer_info(SUBJECTS.events_stream, "sub-dashboards")
            # the dashboards' own principal pulls from, and acks on, its own durable
            async with client_as(keys, secured, "subscriber-dashboards") as (nc, errors):
                js = nc.jetstream(timeout=2.0)
                pulled = await js.pull_subscribe_bind("sub-dashboards", SUBJECTS.events_stream)
                [first] = await pulled.fetch(1, timeout=5)
                # an event (which worker's came first is theirs to say)
                assert first.headers and first.headers["Bc-Type"]
                await first.ack_sync()
                async with client_as(keys, secured, "admin") as (admin, _):
                    info = await admin.jetstream().consumer_info(
                        SUBJECTS.events_stream, "sub-dashboards"
                    )
                    assert info.ack_floor is not None and info.ack_floor.stream_seq >= 1
                assert errors == []
            code, output = await bcw(
                "events",
                "--all",
                "--type",
                "node.connected",
                "--count",
                "1",
                "--idle-exit",
                "10",
                BCW_NATS_URL=secured,
                BCW_SUBJECT_ROOT="bc",
                BCW_NATS_NKEY_SEED_FILE=str(keys / "subscriber.nk"),
            )
            assert code == 0 and "n1" in output, output
        finally:
            await gateway.stop(graceful=False)
            await gateway_nc.close()
            await pool.close()

    # gateway-gw-1 may neither publish gw-2's facts, nor read gw-2's notices
    async with client_as(keys, secured, "gateway-gw-1") as (nc, errors):
        fact = make_fact("closed", gateway_id="gw-2")
        await nc.publish(
            SUBJECTS.fact("gw-2", "closed"), json.dumps({"x": str(fact.fact_id)}).encode()
        )
        await nc.flush()
        await eventually(lambda: violated(errors, "Publish"), what="gw-2's subject refused")
        await nc.subscribe(SUBJECTS.gateway_notices("gw-2"))
        await nc.flush()
        await eventually(lambda: violated(errors, "Subscription"), what="gw-2's notices refused")
        errors.clear()
        js = nc.jetstream(timeout=1.0)
        with pytest.raises(nats.errors.TimeoutError):  # no answer: the request is refused
            await js.add_consumer(
                SUBJECTS.gateway_stream,
                ConsumerConfig(
                    name="gw-gw-2",
                    durable_name="gw-gw-2",
                    filter_subject=SUBJECTS.gateway_notices("gw-2"),
                ),
            )
        assert any("consumer.create" in e.lower() for e in errors), errors

    # a worker may not publish facts, nor change its own consumer (`bcw provision` made it)
    async with client_as(keys, secured, "worker-labeler") as (nc, errors):
        await nc.publish(SUBJECTS.fact("gw-1", "hello"), b"{}")
        await nc.flush()
        await eventually(lambda: violated(errors, "Publish"), what="a worker's fact refused")
        errors.clear()
        with pytest.raises(nats.errors.TimeoutError):  # no answer: the request is refused
            await nc.jetstream(timeout=1.0).delete_consumer(SUBJECTS.facts_stream, "labeler")
        assert any("consumer.delete" in e.lower() for e in errors), errors


async def _one(stream: RecordingStream) -> bool:
    return len(stream.delivered) >= 1


async def _labeled(db: asyncpg.Connection) -> bool:
    return bool(await db.fetchval("SELECT count(*) FROM node_labels WHERE key = 'bc.dev/cap.gpu'"))


async def test_a_row_its_relay_may_not_publish_never_stops_the_worker(
    keys: Path, secured: str, database_url: str, db: asyncpg.Connection
) -> None:
    """The relay of a least-privilege worker meets an outbox row of its own holding what
    that worker does not send (a fact, to a subject its principal may not publish to
    either): the relay refuses it before the server would, the row goes to `outbox_dead`
    and, as a dead letter, to the labeler's own (only the relay principal's say "relay"); the worker keeps running and applying facts. Another
    worker's row (a dispatch, the replay worker's) it never claims: it stays for its owner."""
    code, output = await bcw(
        "provision",
        BCW_NATS_URL=secured,
        BCW_NATS_NKEY_SEED_FILE=str(keys / "admin.nk"),
        # the worker's consumer settings (`make_settings`): it binds what it makes
        BCW_CONSUMER_ACK_WAIT="5s",
        BCW_DATABASE_COMMAND_TIMEOUT="4s",
    )
    assert code == 0, output
    forbidden = SUBJECTS.fact("gw-9", "hello")  # a worker never publishes a fact
    await db.execute(
        "INSERT INTO outbox (msg_id, subject, headers, body, worker) "
        """VALUES (gen_random_uuid(), $1, '{"Bc-Type": "hello"}', $2, 'labeler')""",
        forbidden,
        b"{}",
    )
    # as an older release writes a row: no owner, which its type then gives (outbox_senders)
    dispatch = SUBJECTS.notice("gw-1", "dispatch")
    await db.execute(
        "INSERT INTO outbox (msg_id, subject, headers, body) "
        """VALUES (gen_random_uuid(), $1, '{"Bc-Type": "dispatch"}', $2)""",
        dispatch,
        b"{}",
    )
    assert await db.fetchval("SELECT worker FROM outbox WHERE subject = $1", dispatch) == "replay"
    base = make_settings(secured, database_url, SUBJECTS)
    settings = base.model_copy(update={"nats": nats_as(keys, secured, "worker-labeler")})
    async with running(settings, [WORKERS["labeler"](settings)]):

        async def buried() -> bool:
            return await db.fetchval("SELECT count(*) FROM outbox_dead") == 1

        await eventually(buried, what="the unpublishable row moved to outbox_dead")
        reason = await db.fetchval("SELECT reason FROM outbox_dead")
        assert reason == "worker labeler does not send 'hello'"
        # still at work: a Hello from gw-1 is labeled
        await fleet.session(db, "n1", epoch=1, gateway_id="gw-1")
        async with client_as(keys, secured, "gateway-gw-1") as (nc, errors):
            fact = fleet.hello("n1", 1, capabilities=["gpu"])
            body, headers = REGISTRY.encode(fact)
            await nc.jetstream().publish(
                SUBJECTS.fact("gw-1", "hello"),
                body,
                headers={**headers, "Nats-Msg-Id": str(fact.fact_id)},
            )
            assert errors == []
        await eventually(lambda: _labeled(db), what="the labeler still applying facts")

        async def only_the_dispatch_left() -> bool:  # its own rows relayed, not the other's
            left = await db.fetch("SELECT subject, worker FROM outbox")
            return [(r["subject"], r["worker"]) for r in left] == [(dispatch, "replay")]

        await eventually(only_the_dispatch_left, what="the labeler's rows relayed, not replay's")
    async with client_as(keys, secured, "admin") as (nc, _errors):
        letters = await deadletter.list_dead_letters(nc.jetstream(), SUBJECTS, cause="forged")
    assert [(letter.worker, letter.subject) for letter in letters] == [("labeler", forbidden)]


async def test_the_operator_lists_and_redrives_dead_letters_and_reads_events(
    keys: Path, secured: str
) -> None:
    """Daily operations under least privilege: `operator` does what an operator does —
    dead letters (list, redrive) and events — as the documented commands run them."""
    code, output = await bcw(
        "provision", BCW_NATS_URL=secured, BCW_NATS_NKEY_SEED_FILE=str(keys / "admin.nk")
    )
    assert code == 0, output
    async with client_as(keys, secured, "admin") as (nc, _errors):
        js = nc.jetstream()
        await js.publish(
            SUBJECTS.event("node.connected"),
            b'{"nodeId": "op-1", "epoch": 1}',
            headers={"Bc-Type": "node.connected", "Nats-Msg-Id": "op-event-1"},
        )
        stored = await js.publish(SUBJECTS.fact("gw-1", "hello"), b"{}")  # as a gateway would
        await deadletter.dead_letter(
            js,
            SUBJECTS,
            "labeler",
            subject=SUBJECTS.fact("gw-1", "hello"),
            stream=SUBJECTS.facts_stream,
            stream_seq=stored.seq,
            data=b"{}",
            headers={"Bc-Type": "hello", "Nats-Msg-Id": "op-fact-1"},
            reason="r",
            cause="handler",
        )
    as_operator = {
        "BCW_NATS_URL": secured,
        "BCW_SUBJECT_ROOT": "bc",
        "BCW_NATS_NKEY_SEED_FILE": str(keys / "operator.nk"),
    }
    code, out = await bcw("dead-letters", "list", "--cause", "handler", **as_operator)
    assert code == 0 and "labeler" in out and "1 dead letter(s)" in out, out
    code, out = await bcw("dead-letters", "redrive", "--cause", "handler", "--yes", **as_operator)
    assert code == 0 and "1 re-driven" in out, out
    code, out = await bcw(
        "events", "--all", "--node", "op-1", "--count", "1", "--idle-exit", "10", **as_operator
    )
    assert code == 0 and "op-1" in out, out
    # and nothing an operator has no business with: no consumer, no stream change
    async with client_as(keys, secured, "operator") as (nc, errors):
        js = nc.jetstream(timeout=2.0)
        with pytest.raises(nats.errors.TimeoutError):
            await js.add_consumer(SUBJECTS.facts_stream, ConsumerConfig(durable_name="mine"))
        with pytest.raises(nats.errors.TimeoutError):
            await js.delete_stream(SUBJECTS.events_stream)
        assert any("permissions violation" in e.lower() for e in errors)


async def test_a_subject_refused_in_upper_case_is_buried_once_and_never_waited_on_again(
    keys: Path, secured: str, database_url: str, db: asyncpg.Connection
) -> None:
    """The server's refusal comes back lower-cased: a row bound for `BC.EVENTS.THING`
    (the schema owner's: no fleet worker's table applies) costs one publish timeout, then
    is buried; the next row bound there is buried before it is tried, and a row of the
    same round bound for an allowed subject is published."""
    import time

    from opentelemetry import trace

    from workers.runtime.base.runtime_settings import DatabaseSettings, OutboxSettings
    from workers.runtime.effects.outbox import OutboxRelay
    from workers.runtime.observability.metrics import Metrics

    code, output = await bcw(
        "provision", BCW_NATS_URL=secured, BCW_NATS_NKEY_SEED_FILE=str(keys / "admin.nk")
    )
    assert code == 0, output
    upper = "BC.EVENTS.THING"
    insert = (
        "INSERT INTO outbox (msg_id, subject, headers, body) "
        """VALUES (gen_random_uuid(), $1, '{"Bc-Type": "bench.thing"}', '{}')"""
    )
    await db.execute(insert, upper)
    refused = connection.RefusedSubjects()
    nc = await connection.connect(
        nats_as(keys, secured, "relay"), name="relay", on_publish_refused=refused.add
    )
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        relay = OutboxRelay(
            pool,
            nc.jetstream(),
            OutboxSettings(publish_timeout=2.0),
            DatabaseSettings(url=database_url),
            Metrics(),
            trace.NoOpTracer(),
            SUBJECTS,
            refused=refused,
        )
        assert await relay.publish_round() == 1  # waited for its PubAck once, then buried
        assert upper in refused and "bc.events.thing" not in refused
        await db.execute(insert, upper)
        await db.execute(insert, SUBJECTS.event("thing"))
        started = time.monotonic()
        assert await relay.publish_round() == 2
        assert time.monotonic() - started < 1.0  # not a publish timeout
    finally:
        await pool.close()
        await nc.close()
    reasons = [r["reason"] for r in await db.fetch("SELECT reason FROM outbox_dead")]
    assert reasons == [f"this principal may not publish to {upper}"] * 2
    assert await db.fetchval("SELECT count(*) FROM outbox") == 0
