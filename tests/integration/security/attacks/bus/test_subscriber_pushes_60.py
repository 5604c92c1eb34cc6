"""Issue 60, item 7, attacked as the docs' durable recipe's principal (`subscriber-siem`):
docs/contract.md says a subscriber "must take its replies on its own inbox prefix … a
request whose reply would go elsewhere is refused", and that no subscriber may make a
consumer because "a create request may name any deliver subject, where the server then
pushes the stream (another application's subjects, `bc.revocations`)".

A pull request names its deliver subject too: the reply subject of
`$JS.API.CONSUMER.MSG.NEXT.BC_EVENTS.sub-siem`, which no permission covers. So
`subscriber-siem` has the server push `BC_EVENTS` — a `revocations` message among them,
with its `Bc-Type` — onto `bc.revocations`, where every gateway listens, and into the
gateways' notices stream; the server reports no violation.

The test asserts a defended end state (no gateway hears a revocation the quarantine did not
send now; the notices stream holds nothing new), `xfail(strict=True)` while the finding
stands."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.integration.security.conftest import (
    SUBJECTS,
    answered,
    client_as,
    fresh_streams,
    violated,
)

pytestmark = pytest.mark.slow

FINDING = (
    "finding (issue 60): a pull request's reply subject is a deliver subject the server "
    "pushes the events to, unchecked (docs/contract.md says it is refused)"
)


async def _fresh(keys: Path, secured: str) -> int:
    """The streams, `sub-siem` as `bcw provision` makes it, an event and a revocation in
    the events stream; the notices stream's count."""
    async with fresh_streams(keys, secured) as js:
        await js.add_consumer(
            SUBJECTS.events_stream,
            ConsumerConfig(durable_name="sub-siem", ack_policy=AckPolicy.EXPLICIT),
        )
        await js.publish(
            SUBJECTS.event("node.connected"), b"{}", headers={"Bc-Type": "node.connected"}
        )
        await js.publish(
            SUBJECTS.revocations, b'{"revoked": ["old"]}', headers={"Bc-Type": "revocations"}
        )
        return (await js.stream_info(SUBJECTS.gateway_stream)).state.messages


async def _settled(keys: Path, secured: str, stream: str, count: int) -> int:
    """`stream`'s message count once it differs from `count`, or `count` after 3 s."""
    async with client_as(keys, secured, "admin") as (nc, _):
        js = nc.jetstream()
        for _ in range(30):
            now = (await js.stream_info(stream)).state.messages
            if now != count:
                return now
            await asyncio.sleep(0.1)
    return count


@pytest.mark.xfail(strict=True, reason=FINDING)
@pytest.mark.parametrize("target", ["revocations", "notices"])
async def test_a_subscriber_application_cannot_push_the_events_where_it_names(
    target: str, keys: Path, secured: str
) -> None:
    notices_before = await _fresh(keys, secured)
    heard: list[tuple[str, Any]] = []
    async with client_as(keys, secured, "gateway-gw-1") as (gw1, _):

        async def hear(msg: Any) -> None:
            heard.append((msg.subject, (msg.headers or {}).get("Bc-Type")))

        await gw1.subscribe(SUBJECTS.revocations, cb=hear)
        await gw1.flush()
        deliver = (
            SUBJECTS.revocations if target == "revocations" else SUBJECTS.notice("gw-1", "dispatch")
        )
        async with client_as(keys, secured, "subscriber-siem") as (siem, errors):
            await siem.publish(
                f"$JS.API.CONSUMER.MSG.NEXT.{SUBJECTS.events_stream}.sub-siem",
                json.dumps({"batch": 10, "no_wait": True}).encode(),
                reply=deliver,
            )
            await siem.flush()
            notices_after = await _settled(keys, secured, SUBJECTS.gateway_stream, notices_before)
            for _ in range(30):  # what is pushed comes when it comes
                if heard or target == "notices":
                    break
                await asyncio.sleep(0.1)
        assert errors == [] or not any("violation" in e.lower() for e in errors)
    assert heard == []
    assert notices_after == notices_before


async def test_the_subscribers_recipe_reads_the_events_and_nothing_else(
    keys: Path, secured: str
) -> None:
    """Held: as `subscriber` and as `subscriber-dashboards`, past the events: the facts by
    `STREAM.MSG.GET` (on the facts stream, or on the events stream with a facts subject
    filter), a consumer created with a crafted body (an ordered one, a durable named as
    `sub-siem` with a deliver subject), another application's durable, `_INBOX.>`: none
    answers, nothing is made, `sub-siem` keeps its events."""
    await _fresh(keys, secured)
    async with client_as(keys, secured, "admin") as (admin, _):
        await admin.jetstream().publish(SUBJECTS.fact("gw-1", "hello"), b"{}")
    events, facts = SUBJECTS.events_stream, SUBJECTS.facts_stream
    crafted = {"stream_name": events, "config": {"deliver_subject": "bc.gw.gw-1.dispatch"}}
    asks = {
        f"$JS.API.STREAM.MSG.GET.{facts}": {"seq": 1},
        f"$JS.API.DIRECT.GET.{events}": {"seq": 1},
        f"$JS.API.CONSUMER.CREATE.{events}": crafted,
        f"$JS.API.CONSUMER.CREATE.{events}.sub-siem": crafted,
        f"$JS.API.CONSUMER.DURABLE.CREATE.{events}.sub-siem": crafted,
        f"$JS.API.CONSUMER.MSG.NEXT.{events}.sub-siem": {"batch": 10},
        f"$JS.API.CONSUMER.INFO.{events}.sub-siem": {},
        f"$JS.API.CONSUMER.DELETE.{events}.sub-siem": {},
    }
    for principal in ("subscriber", "subscriber-dashboards"):
        async with client_as(keys, secured, principal) as (nc, errors):
            heard: list[str] = []

            async def hear(msg: Any, into: list[str] = heard) -> None:
                into.append(msg.subject)

            await nc.subscribe("_INBOX.>", cb=hear)
            through = await answered(nc, asks, within=0.3)
            # the events stream answers its own subjects only, whatever the filter
            with contextlib.suppress(nats.js.errors.NotFoundError):
                got = await nc.jetstream().get_msg(events, 1, next=True, subject=SUBJECTS.all_facts)
                through.append(f"a fact from {events}: {got.subject}")
            assert through == [], principal
            assert heard == [] and await violated(errors, "Publish"), principal
    async with client_as(keys, secured, "admin") as (admin, _):
        js = admin.jetstream()
        assert [c.name for c in await js.consumers_info(events)] == ["sub-siem"]
        assert (await js.consumer_info(events, "sub-siem")).num_pending == 2


@pytest.mark.xfail(strict=True, reason=FINDING)
async def test_a_subscriber_application_cannot_publish_an_old_event_again(
    keys: Path, secured: str
) -> None:
    """An event older than the events stream's duplicate window (2 minutes; shortened to
    1 s here, as admin, so that the test need not wait), pulled by `subscriber-siem` with
    an events subject as its reply, is stored again: a second `security.node.quarantined`
    every reader of the stream takes for a new one (docs/contract.md: "readers of the
    stream see each event once")."""
    await _fresh(keys, secured)
    events = SUBJECTS.events_stream
    async with client_as(keys, secured, "admin") as (admin, _):
        js = admin.jetstream()
        config = (await js.stream_info(events)).config
        config.duplicate_window = 1.0
        await js.update_stream(config)
        await js.purge_stream(events)
        await js.publish(
            SUBJECTS.event("security.node.quarantined"),
            b'{"nodeId": "n1"}',
            headers={"Bc-Type": "security.node.quarantined", "Nats-Msg-Id": "q-n1"},
        )
        before = (await js.stream_info(events)).state.messages
    await asyncio.sleep(1.5)
    async with client_as(keys, secured, "subscriber-siem") as (siem, _):
        await siem.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{events}.sub-siem",
            b'{"batch": 1, "no_wait": true}',
            reply=SUBJECTS.event("anything"),
        )
        await siem.flush()
    assert await _settled(keys, secured, events, before) == before
