"""Each gateway's facts in a stream of its own (`BCW_NATS_FACTS_GATEWAYS`), sourced by the
facts stream, on a real nats-server: switched to in place with nothing lost or doubled,
a gateway added later, never switched back behind an operator's back, and a worker's start
that creates only what it can make consumable."""

from __future__ import annotations

import itertools
import json

import pytest
from nats.aio.client import Client as NATS
from nats.js.errors import ServiceUnavailableError

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import bcw, eventually, make_settings, running, stream_messages
from workers import labeler
from workers.registry import DEAD_PUBLISHERS
from workers.runtime.bus import deadletter, letters, streams

OWN = streams.StreamLimits(gateways=("gw-1", "gw-2"), per_gateway=2**20)


async def _publish(nc: NATS, subjects: Subjects, gateway: str, n: int, size: int = 10) -> str:
    """`n` bodies on a gateway's hello subject; the stream that stored the last."""
    js = nc.jetstream()
    stored = ""
    for i in range(n):
        body = json.dumps({"i": i, "pad": "x" * size}).encode()
        ack = await js.publish(
            subjects.fact(gateway, "hello"), body, headers={"Nats-Msg-Id": f"{gateway}-{i}-{size}"}
        )
        stored = ack.stream
    return stored


async def _pull_all(nc: NATS, subjects: Subjects, durable: str, expected: int) -> list[bytes]:
    """What a durable pull consumer on the facts stream delivers, acked, until `expected`."""
    js = nc.jetstream()
    sub = await js.pull_subscribe(subjects.all_facts, durable, stream=subjects.facts_stream)
    got: list[bytes] = []
    for _ in range(50):
        if len(got) >= expected:
            break
        try:
            for msg in await sub.fetch(expected - len(got), timeout=0.5):
                got.append(msg.data)
                await msg.ack()
        except TimeoutError:
            pass
    await sub.unsubscribe()
    return got


async def test_switching_to_each_gateways_own_stream_loses_and_doubles_nothing(
    nc: NATS, subjects: Subjects
) -> None:
    """A running fleet's single facts stream, a consumer halfway through it: `bcw provision`
    with the gateways listed keeps the stream (its sequence, its consumer, its unread facts)
    and sources the gateways' new streams into it. The consumer then reads every fact once,
    the old ones first; a gateway listed later is sourced once provisioned again."""
    js = nc.jetstream()

    async def sourced(n: int) -> bool:
        return len(await stream_messages(js, subjects.facts_stream)) == n

    await streams.provision_streams(js, subjects)
    assert await _publish(nc, subjects, "gw-1", 10) == subjects.facts_stream
    assert len(await _pull_all(nc, subjects, "reader", 4)) == 4

    done = await streams.provision_streams(js, subjects, limits=OWN)
    assert done == {
        subjects.facts_stream: "updated",
        subjects.gateway_facts_stream("gw-1"): "created",
        subjects.gateway_facts_stream("gw-2"): "created",
        subjects.events_stream: "unchanged",
        subjects.gateway_stream: "unchanged",
        **{subjects.dead_stream_of(p): "unchanged" for p in DEAD_PUBLISHERS},
    }
    assert set((await streams.provision_streams(js, subjects, limits=OWN)).values()) == {
        "unchanged"
    }
    assert await _publish(nc, subjects, "gw-1", 5, size=11) == subjects.gateway_facts_stream("gw-1")
    assert await _publish(nc, subjects, "gw-2", 5) == subjects.gateway_facts_stream("gw-2")
    await eventually(lambda: sourced(20), what="the new facts sourced")
    rest = [json.loads(d) for d in await _pull_all(nc, subjects, "reader", 16)]
    assert [r["i"] for r in rest[:6]] == [4, 5, 6, 7, 8, 9]  # the unread old ones, in order
    assert sorted(r["i"] for r in rest[6:]) == sorted([0, 1, 2, 3, 4] * 2)
    assert len(rest) == 16

    # a third gateway: its facts have no stream until provisioned, then are sourced
    with pytest.raises(Exception):  # noqa: B017 - no stream answers (nats-py: NoRespondersError)
        await js.publish(subjects.fact("gw-3", "hello"), b"{}", timeout=1)
    three = streams.StreamLimits(gateways=("gw-1", "gw-2", "gw-3"), per_gateway=2**20)
    assert (await streams.provision_streams(js, subjects, limits=three))[
        subjects.facts_stream
    ] == "updated"
    assert await _publish(nc, subjects, "gw-3", 1) == subjects.gateway_facts_stream("gw-3")

    await eventually(lambda: sourced(21), what="gw-3's fact in the facts stream")


async def test_a_gateway_fills_only_its_own_stream(nc: NATS, subjects: Subjects) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects, limits=OWN)
    with pytest.raises(ServiceUnavailableError, match="maximum bytes exceeded"):
        await _publish(nc, subjects, "gw-1", 30, size=100_000)  # 3 MB into 1 MiB
    assert await _publish(nc, subjects, "gw-2", 3) == subjects.gateway_facts_stream("gw-2")
    fill = await streams.facts_fill(js, subjects, OWN)
    assert fill[(subjects.gateway_facts_stream("gw-1"), "bytes")] > 0.9
    assert fill[(subjects.gateway_facts_stream("gw-2"), "bytes")] < 0.01
    assert fill[(subjects.facts_stream, "bytes")] == 0.0  # bounded by what it sources
    assert fill[(subjects.facts_stream, "messages")] == 0.0  # and in count


async def test_going_back_to_one_facts_stream_is_refused_naming_the_setting(
    servers: Servers, nc: NATS, subjects: Subjects
) -> None:
    """Without the gateways listed, `bcw provision` would have to take the subjects back
    from streams that may hold unsourced facts: it refuses, one line, exit 2."""
    await streams.provision_streams(nc.jetstream(), subjects, limits=OWN)
    code, output = await bcw(
        "provision", BCW_NATS_URL=servers.nats_url, BCW_SUBJECT_ROOT=subjects.root
    )
    assert code == 2, output
    assert "BCW_NATS_FACTS_GATEWAYS" in output and "Traceback" not in output
    config = (await nc.jetstream().stream_info(subjects.facts_stream)).config
    assert not config.subjects and len(config.sources or []) == 2


async def test_a_workers_start_makes_no_stream_nobody_would_consume(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str
) -> None:
    """A worker whose settings list the gateways, started against a single facts stream,
    leaves it as it is and creates no gateway stream (it would take facts the facts stream
    does not source): switching is `bcw provision`'s. On an empty server it creates them all."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    settings = make_settings(servers.nats_url, database_url, subjects)
    listed = settings.model_copy(
        update={"nats": settings.nats.model_copy(update={"facts_gateways": "gw-1,gw-2"})}
    )
    async with running(listed, [labeler.build(listed)]):
        pass
    names = {s.config.name for s in await js.streams_info()}
    assert subjects.gateway_facts_stream("gw-1") not in names
    assert (await js.stream_info(subjects.facts_stream)).config.subjects == [subjects.all_facts]

    for name in (
        subjects.facts_stream,
        subjects.events_stream,
        subjects.gateway_stream,
        subjects.dead_stream_of("labeler"),
    ):
        await js.delete_stream(name)
    async with running(listed, [labeler.build(listed)]):
        pass
    assert await _publish(nc, subjects, "gw-2", 1) == subjects.gateway_facts_stream("gw-2")


async def test_a_sourced_fact_is_dead_lettered_and_redriven_through_its_gateways_stream(
    nc: NATS, subjects: Subjects
) -> None:
    """A fact the facts stream sourced is dead-lettered at its sequence there, and re-driven
    as that stream holds it: through its gateway's own stream, back into the facts stream,
    without the source header the server wrote."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects, limits=OWN)
    await _publish(nc, subjects, "gw-1", 1)

    async def sourced(n: int) -> bool:
        return len(await stream_messages(js, subjects.facts_stream)) == n

    await eventually(lambda: sourced(1), what="the fact sourced")
    [stored] = await stream_messages(js, subjects.facts_stream)
    assert "Nats-Stream-Source" in (stored.headers or {})
    await deadletter.dead_letter(
        js,
        subjects,
        "labeler",
        subject=stored.subject,
        stream=subjects.facts_stream,
        stream_seq=stored.seq,
        data=stored.data,
        headers=stored.headers,
        reason="test",
        cause="unsupported-major",
    )
    [letter] = await deadletter.list_dead_letters(js, subjects)
    assert "Nats-Stream-Source" not in letter.headers
    await letters.redrive(js, subjects, letter)

    await eventually(lambda: sourced(2), what="the re-driven fact sourced again")
    again = (await stream_messages(js, subjects.facts_stream))[-1]
    assert (again.subject, again.data) == (stored.subject, stored.data)
    assert (await js.stream_info(subjects.gateway_facts_stream("gw-1"))).state.messages == 2


async def test_the_simulator_refuses_a_bus_whose_gateways_each_have_their_own_stream(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str
) -> None:
    """Its gateways (ids of its own) would have no stream: their facts would be refused."""
    await streams.provision_streams(nc.jetstream(), subjects, limits=OWN)
    code, output = await bcw(
        "sim",
        "--scenario",
        "power-on",
        "--nodes",
        "2",
        "--gateways",
        "1",
        BCW_NATS_URL=servers.nats_url,
        BCW_DATABASE_URL=database_url,
        BCW_SUBJECT_ROOT=subjects.root,
    )
    assert code == 2, output
    assert "BCW_SUBJECT_ROOT" in output and "own stream" in output and "Traceback" not in output
    assert await streams.gateways_sourced(nc.jetstream(), subjects) == [
        subjects.gateway_facts_stream("gw-1"),
        subjects.gateway_facts_stream("gw-2"),
    ]


async def test_a_flush_too_large_for_one_message_is_cut_and_every_session_arrives(
    nc: NATS, subjects: Subjects
) -> None:
    """9,000 sessions' entries, each with its lanes' credits, are about 2 MB: one fact
    would be refused by nats-server (max_payload 1 MiB here), and the flush lost. The
    reference gateway cuts it by ranges of node hashes into facts of at most 256 KiB of
    entries; every session is in exactly one of them, the one of its hash's range."""
    from types import SimpleNamespace

    from schemas import REGISTRY
    from schemas.facts import HASH_SPACE, Liveness, node_hash
    from workers.gateway.facts import MAX_FLUSH_BYTES, FactPublisher

    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    sessions = [
        SimpleNamespace(
            node_id=f"node-{n:05d}-{'x' * 40}",
            epoch=n + 1,
            last_seen=99.0,
            credits={f"lane-{k}-{'y' * 20}": k for k in range(4)},
            load=0.5,
            node_load=None,
            applied_generation=0,
            reported_generation=0,
            hash=node_hash(f"node-{n:05d}-{'x' * 40}"),
        )
        for n in range(9_000)
    ]
    publisher = FactPublisher("gw-big", js, subjects, clock=lambda: 100.0)
    await publisher.flush(sessions, now=100.0)  # type: ignore[arg-type]  # what it reads of one

    stored = await stream_messages(js, subjects.facts_stream, subjects.fact("gw-big", "liveness"))
    assert len(stored) >= 8  # about 2 MB in pieces of at most 256 KiB
    assert sum(len(msg.data) for msg in stored) > nc.max_payload  # one would have been refused
    seen: list[tuple[str, int]] = []
    ranges: list[tuple[int | None, int | None]] = []
    for msg in stored:
        assert len(msg.data) <= MAX_FLUSH_BYTES + 1024  # entries, and the fact's few fields
        fact = REGISTRY.decode(msg.headers, msg.data)
        assert isinstance(fact, Liveness) and fact.gateway_id == "gw-big"
        seen += [(entry["node_id"], entry["epoch"]) for entry in fact.entries]
        assert all(entry["age_ms"] == 1000 for entry in fact.entries)
        # a range of node hashes: every entry's is in it
        assert fact.range_start is not None and fact.range_end is not None
        assert all(
            fact.range_start <= node_hash(e["node_id"]) < fact.range_end for e in fact.entries
        )
        ranges.append((fact.range_start, fact.range_end))
    assert sorted(seen) == [(s.node_id, s.epoch) for s in sessions]
    # 16 ranges (9,000 sessions) that tile the hash space, in order
    assert len(ranges) == 16 and ranges[0][0] == 0 and ranges[-1][1] == HASH_SPACE
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


async def test_an_upgrade_bounds_the_one_facts_stream_per_gateway_in_place(
    nc: NATS, subjects: Subjects
) -> None:
    """A one-stream `BC_FACTS` as an earlier release made it (no bound per subject), facts
    in it and a consumer halfway: `bcw provision` bounds each gateway's subjects in place
    (an upgrade keeps the layout) — but not while a subject holds more than its share,
    which the server would drop — keeping the stream's facts and its consumer; from then on
    a gateway's subject takes no more than its share."""
    js = nc.jetstream()
    limits = streams.StreamLimits(msgs_per_gateway=80)  # 10 a fact type
    [old, *rest] = streams.stream_configs(subjects, limits=limits)
    old.max_msgs_per_subject, old.discard_new_per_subject = -1, False
    for config in (old, *rest):
        await js.add_stream(config)
    await _publish(nc, subjects, "gw-1", 15)
    assert len(await _pull_all(nc, subjects, "before", 5)) == 5
    # gw-1's hello subject holds 15, over its share: bounding it now would drop 5
    status = await streams.provision_streams(js, subjects, limits=limits)
    assert status[subjects.facts_stream] == "unchanged"
    assert (await js.stream_info(subjects.facts_stream)).state.messages == 15
    await js.purge_stream(subjects.facts_stream, subject=subjects.fact("gw-1", "hello"), keep=8)
    assert (await streams.provision_streams(js, subjects, limits=limits)) == {
        **dict.fromkeys(status, "unchanged"),
        subjects.facts_stream: "updated",
    }
    info = await js.stream_info(subjects.facts_stream)
    assert (info.config.max_msgs_per_subject, info.config.discard_new_per_subject) == (10, True)
    assert info.state.messages == 8
    assert (await js.consumer_info(subjects.facts_stream, "before")).num_pending == 8
    await _publish(nc, subjects, "gw-1", 2, size=11)
    with pytest.raises(ServiceUnavailableError, match="maximum messages per subject"):
        await _publish(nc, subjects, "gw-1", 1, size=12)
    assert await _publish(nc, subjects, "gw-2", 10) == subjects.facts_stream
