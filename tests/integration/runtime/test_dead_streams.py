"""The dead-letter streams, one per publisher (issue 59, finding 14), and the upgrade from
the one dead stream (`BC_DEAD`, `bc.dead.>`): the old stream's letters stay listed and
re-drivable; a worker started before `bcw provision` leaves its own stream missing (its
letters still go to the old one); `bcw provision` narrows the old stream, and what an
older release's process publishes under its `bc.dead.<worker>.>` then lands in that
worker's own stream. A listing reads a dead stream as `bcw events` reads the events: one
request a letter (`next_by_subj`), however many were re-driven (deleted) between them."""

from __future__ import annotations

import dataclasses

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig

from schemas.subjects import Subjects
from tests.integration.support import stream_messages
from workers.registry import DEAD_PUBLISHERS
from workers.runtime.bus import deadletter, letters, streams


async def test_the_old_dead_streams_letters_stay_listed_and_redrivable(
    nc: NATS, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    for publisher in DEAD_PUBLISHERS:  # as an older release left the bus
        await js.delete_stream(subjects.dead_stream_of(publisher))
    [old] = [
        c for c in streams.stream_configs(subjects) if c.name == subjects.dead_stream_of("relay")
    ]
    await js.add_stream(
        dataclasses.replace(old, name=subjects.dead_stream, subjects=[subjects.all_dead])
    )
    fact = await js.publish(subjects.fact("gw-1", "hello"), b"{}", headers={"Bc-Type": "hello"})
    await deadletter.dead_letter(
        js,
        subjects,
        "liveness",
        subject=subjects.fact("gw-1", "hello"),
        stream=subjects.facts_stream,
        stream_seq=fact.seq,
        data=b"{}",
        headers={"Bc-Type": "hello"},
        reason="older",
        cause="handler",
    )
    assert (await js.stream_info(subjects.dead_stream)).state.messages == 1

    # a worker of this release started before `bcw provision`: its own stream cannot take
    # the old one's subjects yet; it starts, and its letters go to the old one
    mine = dataclasses.replace(streams.StreamLimits(), dead_publishers=("liveness",))
    started = await streams.streams_for_a_worker(js, subjects, limits=mine)
    assert started[subjects.dead_stream_of("liveness")] == "missing"

    done = await streams.provision_streams(js, subjects)
    assert done[subjects.dead_stream] == "narrowed"
    assert {done[subjects.dead_stream_of(p)] for p in DEAD_PUBLISHERS} == {"created"}
    narrowed = await js.stream_info(subjects.dead_stream)
    assert narrowed.config.subjects == [subjects.legacy_dead] and narrowed.state.messages == 1
    assert (await streams.provision_streams(js, subjects))[subjects.dead_stream] == "kept"

    # an older release's liveness process publishes where it always did: its own stream
    older = {deadletter.WORKER: "liveness", deadletter.CAUSE: "handler"}
    ack = await js.publish(f"{subjects.dead('liveness')}.handler.gw-1", b"{}", headers=older)
    assert ack.stream == subjects.dead_stream_of("liveness")

    listed = await deadletter.list_dead_letters(js, subjects, "liveness")
    assert [x.key for x in listed] == [
        f"{subjects.dead_stream}:1",
        f"{subjects.dead_stream_of('liveness')}:1",
    ]  # the old stream's first, then the publisher's own
    found, missing = await deadletter.dead_letters_at(js, subjects, [(subjects.dead_stream, 1)])
    assert [x.reason for x in found] == ["older"] and missing == []
    await letters.redrive(js, subjects, found[0])
    assert [m.data for m in await stream_messages(js, subjects.facts_stream)] == [b"{}", b"{}"]
    assert (await js.stream_info(subjects.dead_stream)).state.messages == 0
    assert await deadletter.dead_streams(js, subjects) == sorted(
        [subjects.dead_stream, *map(subjects.dead_stream_of, DEAD_PUBLISHERS)]
    )


async def test_a_stream_with_another_storage_is_reported_not_clobbered(
    nc: NATS, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(
            name=subjects.dead_stream_of("relay"),
            subjects=subjects.dead_of("relay"),
            storage=StorageType.MEMORY,
        )
    )
    with pytest.raises(streams.ProvisionError, match="storage"):
        await streams.provision_streams(js, subjects)


async def test_a_fact_every_worker_lettered_is_redriven_once(nc: NATS, subjects: Subjects) -> None:
    """A fact bad for every worker is lettered by each that reads it, each in its own
    stream; re-driving them all re-sends it once (the facts stream drops the doubles)."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    bad = await js.publish(subjects.fact("gw-1", "hello"), b"{}", headers={"Bc-Type": "hello"})
    for worker in ("labeler", "liveness", "replay"):
        await deadletter.dead_letter(
            js,
            subjects,
            worker,
            subject=subjects.fact("gw-1", "hello"),
            stream=subjects.facts_stream,
            stream_seq=bad.seq,
            data=b"{}",
            headers={"Bc-Type": "hello", "Nats-Msg-Id": "bad-1"},
            reason="r",
            cause="invalid",
        )
    lettered = await deadletter.list_dead_letters(js, subjects)
    assert sorted(x.stream for x in lettered) == sorted(
        subjects.dead_stream_of(w) for w in ("labeler", "liveness", "replay")
    )
    for letter in lettered:
        await letters.redrive(js, subjects, letter)
    assert len(await stream_messages(js, subjects.facts_stream)) == 2  # the fact, and once more
    assert await deadletter.list_dead_letters(js, subjects) == []


async def test_a_listing_costs_one_request_a_letter_whatever_the_gaps(
    nc: NATS, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    for n in range(40):
        await deadletter.dead_letter(
            js,
            subjects,
            "liveness",
            subject=subjects.fact("gw-1", "hello"),
            stream=subjects.facts_stream,
            stream_seq=n + 1,
            data=b"{}",
            headers={"Bc-Type": "hello"},
            reason=f"letter {n}",
            cause="handler",
        )
    own = subjects.dead_stream_of("liveness")
    kept = {1, 20, 40}
    for seq in set(range(1, 41)) - kept:  # re-driven: deleted from the stream
        await js.delete_msg(own, seq)
    requests: list[Msg] = []

    async def seen(msg: Msg) -> None:
        requests.append(msg)

    watch = await nc.subscribe(f"$JS.API.STREAM.MSG.GET.{own}", cb=seen)
    await nc.flush()
    listed = await deadletter.list_dead_letters(js, subjects, "liveness")
    await nc.flush()
    assert [(x.stream, x.seq, x.reason) for x in listed] == [
        (own, 1, "letter 0"),
        (own, 20, "letter 19"),
        (own, 40, "letter 39"),
    ]
    assert len(requests) == 3  # one a letter: the 37 gaps cost none
    requests.clear()
    page = await deadletter.list_dead_letters(js, subjects, "liveness", limit=1, after=(own, 1))
    await nc.flush()
    assert [x.seq for x in page] == [20] and len(requests) == 1
    rest = await deadletter.list_dead_letters(js, subjects, "liveness", after=(own, 40))
    assert rest == []
    await watch.unsubscribe()
