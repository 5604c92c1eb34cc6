"""`bcw dead-letters list` reads a dead stream as `bcw events` reads the events: one
request per letter (`next_by_subj`), however many letters were re-driven (deleted)
between them, and a page goes on after the last letter listed."""

from __future__ import annotations

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from schemas.subjects import Subjects
from workers.runtime.bus import deadletter, streams


async def test_a_listing_costs_one_request_a_letter_whatever_the_gaps(
    nc: NATS, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    for n in range(40):
        await deadletter.dead_letter(
            js, subjects, "liveness", subject=subjects.fact("gw-1", "hello"),
            stream=subjects.facts_stream, stream_seq=n + 1, data=b"{}",
            headers={"Bc-Type": "hello"}, reason=f"letter {n}", cause="handler",
        )  # fmt: skip
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
        (own, 1, "letter 0"), (own, 20, "letter 19"), (own, 40, "letter 39"),
    ]  # fmt: skip
    assert len(requests) == 3  # one a letter: the 37 gaps cost none
    requests.clear()
    page = await deadletter.list_dead_letters(js, subjects, "liveness", limit=1, after=(own, 1))
    await nc.flush()
    assert [x.seq for x in page] == [20] and len(requests) == 1
    rest = await deadletter.list_dead_letters(js, subjects, "liveness", after=(own, 40))
    assert rest == []
    await watch.unsubscribe()
