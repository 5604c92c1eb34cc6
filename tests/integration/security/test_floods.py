"""Floods any login can send, bounded in what they cost the others (issue #41, "a quota
per gateway"): a NOTIFY storm on the workers' channels, a node's epoch churn, and
flushes of 10,000 unknown nodes."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import timedelta
from pathlib import Path

import asyncpg
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS

from schemas import REGISTRY
from schemas.subjects import Subjects
from tests.conftest import Clock, Servers
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.security.conftest import SUBJECTS, client_as, nats_as, provision_consumers
from tests.integration.support import (
    bcw_process,
    eventually,
    make_settings,
    publish_fact,
    publish_raw,
    running,
    stream_messages,
)
from workers.registry import WORKERS
from workers.replay.apply import DISPATCH_CHANNEL
from workers.runtime.base.runtime_settings import DatabaseSettings
from workers.runtime.bus import deadletter, letters, streams
from workers.runtime.store.notify import DEBOUNCE, Listener

pytestmark = pytest.mark.slow


async def test_a_notify_storm_wakes_the_dispatch_loop_a_bounded_number_of_times(
    logins: dict[str, str], database_url: str
) -> None:
    """The labeler's login NOTIFYs the dispatch loop's channel 20,000 times in a few seconds
    (a worker's login reads its name: `wake_channels`). The dispatch loop's listener — not
    shedding storms here (`storm`: test_notify_59.py sheds them) — is woken at
    most once per debounce, and still at once for the first of a quiet spell. The
    debounce is ten times the workers' (`DEBOUNCE`), so that "at once" is told from
    "after the debounce" on a loaded machine too (a wake-up 65 ms late failed it)."""
    debounce = DEBOUNCE * 10
    wake, stopping = asyncio.Event(), asyncio.Event()
    listener = Listener(
        DatabaseSettings(url=database_url), [DISPATCH_CHANNEL], wake, debounce, storm=10**9
    )
    listening = asyncio.create_task(listener.run(stopping))
    rounds = 0
    ticked = asyncio.Event()

    async def loop() -> None:  # as the dispatch loop: a round per wake-up
        nonlocal rounds
        while not stopping.is_set():
            await wake.wait()
            wake.clear()
            rounds += 1
            ticked.set()

    looping = asyncio.create_task(loop())
    attacker = await asyncpg.connect(logins["bcw_labeler"])
    channel = await attacker.fetchval(
        "SELECT channel FROM wake_channels WHERE name = $1", DISPATCH_CHANNEL
    )
    try:
        for _ in range(100):
            if listener.listening:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(debounce * 2)  # the wake-up of its connecting is past: a quiet spell
        rounds = 0
        ticked.clear()
        # one quiet notification: woken at once
        started = time.monotonic()
        await attacker.execute(f"SELECT pg_notify('{channel}', 'first')")
        await asyncio.wait_for(ticked.wait(), 5)
        assert time.monotonic() - started < debounce
        await asyncio.sleep(debounce * 2)
        rounds, woken = 0, listener.woken
        started = time.monotonic()
        for batch in range(200):  # distinct payloads: PostgreSQL folds equal ones
            await attacker.execute(
                f"SELECT pg_notify('{channel}', '{batch}:' || i) FROM generate_series(1, 100) AS i"
            )
        await asyncio.sleep(debounce * 3)
        elapsed = time.monotonic() - started
        assert listener.notified >= 20_000
        bound = elapsed / debounce + 2
        assert listener.woken - woken <= bound, (listener.woken - woken, elapsed)
        assert rounds <= bound
    finally:
        stopping.set()
        wake.set()
        await attacker.close()
        for task in (listening, looping):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_nodes_hello_prunes_its_epochs_without_reading_its_history(
    db: asyncpg.Connection,
) -> None:
    """20,000 Hellos of one node in a day: each Hello's prune of the node's old epochs
    finds them by (node_id, issued_at) — the rows to delete only — not by scanning every
    earlier epoch of the node (which made its Hello 12 times slower)."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1")
    await db.execute(
        "INSERT INTO session_epochs (node_id, epoch, gateway_id, issued_at) "
        "SELECT 'n1', e, 'gw-1', compute_now() - interval '1 second' * e "
        "FROM generate_series(2, 20001) AS e"
    )
    await db.execute("ANALYZE session_epochs")
    plan = "\n".join(
        r[0]
        for r in await db.fetch(
            "EXPLAIN (ANALYZE, BUFFERS) DELETE FROM session_epochs WHERE node_id = 'n1' "
            "AND issued_at < compute_now() - interval '1 day' AND epoch < 20002"
        )
    )
    assert "session_epochs_node_issued" in plan, plan
    assert "Rows Removed by Filter" not in plan, plan


async def test_ten_thousand_entry_flushes_keep_the_liveness_worker_under_its_memory_limit(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    """gw-1's nkey publishes 100 flushes of 10,000 unknown nodes each (a million entries,
    queued before the worker starts: it meets full batches). A `bcw run liveness` process
    applies them within the chart's 512 MiB — a batch holds at most `batch_bytes` of facts,
    a statement `FLUSH_CHUNK` entries — and gw-2's flush behind them still takes effect."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    await fleet.session(db, "honest", epoch=1, gateway_id="gw-2", seen_ago=timedelta(minutes=5))
    template = make_fact("liveness", gateway_id="gw-1", entries=[])
    for flush in range(100):
        wire = json.loads(REGISTRY.encode(template)[0])
        wire["fact_id"] = str(uuid.uuid4())
        wire["entries"] = [
            {"node_id": f"flood-{flush}-{n}", "epoch": 1, "age_ms": 100} for n in range(10_000)
        ]
        await js.publish(
            subjects.fact("gw-1", "liveness"),
            json.dumps(wire).encode(),
            headers={**REGISTRY.encode(template)[1], "Nats-Msg-Id": wire["fact_id"]},
        )
    honest = make_fact(
        "liveness", gateway_id="gw-2", entries=[{"node_id": "honest", "epoch": 1, "age_ms": 0}]
    )
    await publish_fact(js, subjects, honest)
    worker = await bcw_process(
        "run",
        "liveness",
        BCW_DATABASE_URL=database_url,
        BCW_NATS_URL=servers.nats_url,
        BCW_SUBJECT_ROOT=subjects.root,
        BCW_HEALTH_PORT="0",
    )
    try:

        async def drained() -> bool:
            seen = await db.fetchval(
                "SELECT last_seen > compute_now() - interval '1 minute' FROM node_sessions "
                "WHERE node_id = 'honest'"
            )
            try:
                info = await js.consumer_info(subjects.facts_stream, "liveness")
            except nats.js.errors.NotFoundError:
                return False  # the worker has not made it yet
            return bool(seen) and info.num_pending == 0 and info.num_ack_pending == 0

        await eventually(drained, within=90, what="the flood applied, gw-2's flush too")
        peak = _peak_rss_mib(worker.pid)
    finally:
        worker.terminate()
        await worker.wait()
    assert peak < 512, f"the liveness worker peaked at {peak:.0f} MiB"


def _peak_rss_mib(pid: int) -> float:
    """A process's peak resident set (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def test_a_flood_of_junk_evicts_no_other_gateways_letter_nor_a_parked_fact(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str
) -> None:
    """gw-1 sends 300 invalid facts of 100 KB each (30 MB). Their letters keep 4 KiB of body
    each, and the dead stream keeps at most `dead_letters_per_source` of them (here 100):
    gw-2's invalid fact's letter and gw-1's own parked fact (a schema major this release
    does not speak) are still there, and gw-2's is re-driven as the facts stream holds it."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects, limits=streams.StreamLimits(dead_per_source=100))
    genuine = make_fact("hello", gateway_id="gw-2", node_id="n2")
    body, headers = REGISTRY.encode(genuine)
    await publish_raw(
        js,
        subjects.fact("gw-2", "hello"),
        json.dumps({**json.loads(body), "epoch": "x"}).encode(),
        {**headers, "Nats-Msg-Id": str(genuine.fact_id)},
    )
    parked = make_fact("hello", gateway_id="gw-1", node_id="n1")
    body, headers = REGISTRY.encode(parked)
    await publish_raw(
        js,
        subjects.fact("gw-1", "hello"),
        body,
        {**headers, "Bc-Schema": "2", "Nats-Msg-Id": str(parked.fact_id)},
    )
    junk = b'{"x": "' + b"j" * 100_000 + b'"}'
    for i in range(300):
        await publish_raw(
            js,
            subjects.fact("gw-1", "hello"),
            junk,
            {"Bc-Type": "hello", "Nats-Msg-Id": f"junk-{i}"},
        )
    settings = make_settings(servers.nats_url, database_url, subjects)
    async with running(settings, [WORKERS["labeler"](settings)]):

        async def all_lettered() -> bool:
            info = await js.consumer_info(subjects.facts_stream, "labeler")
            return info.num_pending == 0 and info.num_ack_pending == 0

        await eventually(all_lettered, within=60, what="every fact read")
    letters_by_subject: dict[str, int] = {}
    kept = await deadletter.list_dead_letters(js, subjects, limit=10_000)
    for letter in kept:
        letters_by_subject[letter.on] = letters_by_subject.get(letter.on, 0) + 1
    assert letters_by_subject == {
        f"{subjects.root}.dead.labeler.invalid.gw-1": 100,
        f"{subjects.root}.dead.labeler.invalid.gw-2": 1,
        f"{subjects.root}.dead.labeler.unsupported-major.gw-1": 1,
    }
    assert (await js.stream_info(subjects.dead_stream_of("labeler"))).state.bytes < 100 * 6000
    [theirs] = [x for x in kept if x.on.endswith(".gw-2")]
    [mine] = [x for x in kept if x.cause == "unsupported-major"]
    assert mine.data == body  # parked whole
    await letters.redrive(js, subjects, theirs)
    facts = await stream_messages(js, subjects.facts_stream)
    assert facts[-1].subject == subjects.fact("gw-2", "hello") and facts[-1].data == facts[0].data


async def test_a_gateways_flood_of_foreign_facts_is_shed_and_the_others_flushes_go_on(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    """gw-1 floods `closed` facts about sessions it never held (20,000, queued before the
    worker starts). Past 1,000 foreign ones its `closed` facts are shed — acknowledged
    unread, counted — so gw-2's flush behind the flood takes effect, and so does gw-1's
    own flush of its own session (only the flooded type is shed)."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    await fleet.session(db, "theirs", epoch=3, gateway_id="gw-2", seen_ago=timedelta(minutes=5))
    await fleet.session(db, "mine", epoch=1, gateway_id="gw-1", seen_ago=timedelta(minutes=5))
    template = make_fact("closed", gateway_id="gw-1", node_id="theirs", epoch=3)
    body, headers = REGISTRY.encode(template)
    wire = json.loads(body)
    for _ in range(20_000):
        wire["fact_id"] = str(uuid.uuid4())
        await js.publish(
            subjects.fact("gw-1", "closed"),
            json.dumps(wire).encode(),
            headers={**headers, "Nats-Msg-Id": wire["fact_id"]},
        )
    for gateway, node, epoch in (("gw-2", "theirs", 3), ("gw-1", "mine", 1)):
        flush = make_fact(
            "liveness", gateway_id=gateway, entries=[{"node_id": node, "epoch": epoch, "age_ms": 0}]
        )
        await publish_fact(js, subjects, flush)
    settings = make_settings(servers.nats_url, database_url, subjects)
    async with running(settings, [WORKERS["liveness"](settings)]) as (runtime, _port):

        async def both_seen() -> bool:
            fresh = await db.fetchval(
                "SELECT count(*) FROM node_sessions WHERE node_id IN ('theirs', 'mine') "
                "AND last_seen > compute_now() - interval '1 minute'"
            )
            return bool(fresh == 2)

        await eventually(both_seen, within=60, what="both flushes applied behind the flood")
        shed = runtime.metrics.facts.value("liveness", "closed", "shed")
        checked = runtime.metrics.facts.value("liveness", "closed", "foreign")
    assert shed + checked == 20_000 and shed >= 15_000, (shed, checked)
    # the flood changed nothing: gw-2's session is still routed to gw-2
    row = await db.fetchrow(
        "SELECT gateway_id, session_epoch FROM node_sessions WHERE node_id = 'theirs'"
    )
    assert (row["gateway_id"], row["session_epoch"]) == ("gw-2", 3)


async def test_a_gateway_that_fills_the_facts_stream_fills_only_its_own(
    keys: Path, secured: str, database_url: str, db: asyncpg.Connection
) -> None:
    """With each gateway's facts in a stream of its own (`BCW_NATS_FACTS_GATEWAYS`), gw-1's
    nkey floods 100 KB facts: its 1 MiB is refused from the eleventh on, and it can neither
    raise its bound nor purge anything. gw-2's flush is still accepted and applied by the
    liveness worker, logged in as its own principal, which says how full each stream is."""
    settings = make_settings(secured, database_url, SUBJECTS)
    own = {"facts_gateways": "gw-1,gw-2", "facts_bytes_per_gateway": 2**20}
    admin = nats_as(keys, secured, "admin").model_copy(update=own)
    async with client_as(keys, secured, "admin") as (nc, _):
        await streams.provision_streams(nc.jetstream(), SUBJECTS, limits=streams.limits_of(admin))
    await fleet.session(db, "theirs", epoch=3, gateway_id="gw-2", seen_ago=timedelta(minutes=5))
    junk = b'{"x": "' + b"j" * 100_000 + b'"}'
    async with client_as(keys, secured, "gateway-gw-1") as (attacker, errors):
        js = attacker.jetstream()
        stored = 0
        with pytest.raises(nats.js.errors.ServiceUnavailableError, match="maximum bytes"):
            for i in range(30):
                await js.publish(
                    SUBJECTS.fact("gw-1", "hello"),
                    junk,
                    headers={"Bc-Type": "hello", "Nats-Msg-Id": f"fill-{i}"},
                )
                stored += 1
        assert stored == 10
        for api in ("STREAM.UPDATE", "STREAM.PURGE", "STREAM.DELETE"):
            await attacker.publish(f"$JS.API.{api}.{SUBJECTS.gateway_facts_stream('gw-1')}", b"{}")
        await attacker.flush()
        await asyncio.sleep(0.2)
        assert sum("permissions violation" in e.lower() for e in errors) == 3
    async with client_as(keys, secured, "gateway-gw-2") as (honest, _):
        flush = make_fact(
            "liveness", gateway_id="gw-2", entries=[{"node_id": "theirs", "epoch": 3, "age_ms": 0}]
        )
        body, headers = REGISTRY.encode(flush)
        ack = await honest.jetstream().publish(
            SUBJECTS.fact("gw-2", "liveness"),
            body,
            headers={**headers, "Nats-Msg-Id": str(flush.fact_id)},
        )
        assert ack.stream == SUBJECTS.gateway_facts_stream("gw-2")
    worker = settings.model_copy(
        update={"nats": nats_as(keys, secured, "worker-liveness").model_copy(update=own)}
    )
    await provision_consumers(keys, secured, worker, ["liveness"])
    async with running(worker, [WORKERS["liveness"](worker)]) as (runtime, _port):

        async def seen() -> bool:
            return bool(
                await db.fetchval(
                    "SELECT last_seen > compute_now() - interval '1 minute' FROM node_sessions "
                    "WHERE node_id = 'theirs'"
                )
            )

        await eventually(seen, within=30, what="gw-2's flush applied")

        async def said() -> bool:
            return (
                runtime.metrics.facts_stream_full.value(
                    SUBJECTS.gateway_facts_stream("gw-1"), "bytes"
                )
                > 0.9
            )

        await eventually(said, within=20, what="gw-1's full stream said")
        gw2 = SUBJECTS.gateway_facts_stream("gw-2")
        assert runtime.metrics.facts_stream_full.value(gw2, "bytes") < 0.01


async def test_the_epoch_before_a_hello_is_kept_however_long_it_lasted(
    db: asyncpg.Connection, clock: Clock
) -> None:
    """A session that lasted more than a day keeps its binding when the node moves on
    (migration 0052): its gateway's late facts — a result the daemon sent before it moved
    — are still the node's. Older epochs than that go once a day old."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1")
    for gateway in ("gw-2", "gw-1"):  # each session two days long, then the next Hello
        await clock.advance(timedelta(days=2))
        await db.execute(
            "UPDATE node_sessions SET session_epoch = session_epoch + 1, gateway_id = $1",
            gateway,
        )
    kept = await db.fetch("SELECT epoch FROM session_epochs WHERE node_id = 'n1' ORDER BY epoch")
    assert [r["epoch"] for r in kept] == [2, 3]
