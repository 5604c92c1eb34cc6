"""Issue 60, items 1 and 7, attacked: a JetStream API request's *reply subject* is where
the server sends its answer, and no permission covers it (nats-server checks the request's
subject only). The answer is then published inside the account like any message, and the
stream whose subjects it matches stores it.

So a principal that may ask anything at all — the new `tester` (`$JS.API.INFO`), the
`subscriber` of the docs' recipe (`STREAM.MSG.GET` of the events), another gateway
(`$JS.API.INFO`) — can name gw-1's Hello subject as the reply and have the server write
into gw-1's facts: a message attributed to gw-1 (its subject), counted in gw-1's own
bound. 125 requests (layout A: gw-1's per-subject share of `hello` with
`BCW_NATS_FACTS_MSGS_PER_GATEWAY=1000`) or 1,000 (layout B: gw-1's own stream) and gw-1's
real Hello is refused: the bound of issue #59 ("one gateway cannot fill it for the
others") is filled by someone else, and a login that "reads the streams' settings,
nothing else" has written a fact.

The tests assert the end state a defended bus has (gw-1's own Hello accepted, no message
in its facts but its own); they are marked `xfail(strict=True)` while the finding stands,
and fail (XPASS) the day it is fixed, to be unmarked then."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest

from tests.integration.security.conftest import SUBJECTS, client_as, fresh_streams

pytestmark = pytest.mark.slow

LAYOUTS: dict[str, dict[str, Any]] = {
    "A-one-stream": {"facts_msgs_per_gateway": 1000, "stream_max_msgs": 10_000},
    "B-per-gateway": {
        "facts_gateways": "gw-1,gw-2",
        "facts_msgs_per_gateway": 1000,
        "stream_max_msgs": 10_000,
    },
}
#: attacker → (the request it may make, its body): each answer is sent where it says
ASKS: dict[str, tuple[str, bytes]] = {
    "tester": ("$JS.API.INFO", b""),
    "subscriber": (f"$JS.API.STREAM.MSG.GET.{SUBJECTS.events_stream}", b'{"seq": 1}'),
    "gateway-gw-2": ("$JS.API.INFO", b""),
}
FINDING = (
    "finding (issue 60): a JetStream API answer goes to any reply subject the asker names, "
    "stream subjects included; nothing in auth.conf can refuse it"
)


async def _fresh(keys: Path, secured: str, layout: dict[str, Any]) -> None:
    """The streams as `bcw provision` makes them for `layout`, one event in the events."""
    async with fresh_streams(keys, secured, layout) as js:
        await js.publish(SUBJECTS.event("node.connected"), b"{}")


async def _settled(keys: Path, secured: str, layout: dict[str, Any]) -> None:
    """Until the server has answered every request (it answers after the flush)."""
    stream = SUBJECTS.gateway_facts_stream("gw-1") if "facts_gateways" in layout else None
    async with client_as(keys, secured, "admin") as (nc, _):
        js = nc.jetstream()
        seen = -1
        for _ in range(50):
            count = (await js.stream_info(stream or SUBJECTS.facts_stream)).state.messages
            if count == seen:
                return
            seen = count
            await asyncio.sleep(0.3)


async def _gw1_facts(keys: Path, secured: str) -> list[tuple[str | None, Any]]:
    """Every message of gw-1's facts in the facts stream: its subject and `Bc-Type`."""
    async with client_as(keys, secured, "admin") as (nc, _):
        js = nc.jetstream()
        await asyncio.sleep(0.3)  # a gateway's own stream is sourced by the facts stream
        info = await js.stream_info(SUBJECTS.facts_stream)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            with contextlib.suppress(nats.js.errors.NotFoundError):  # a dropped one
                msg = await js.get_msg(SUBJECTS.facts_stream, seq)
                out.append((msg.subject, (msg.headers or {}).get("Bc-Type")))
        return out


@pytest.mark.xfail(strict=True, reason=FINDING)
@pytest.mark.parametrize("attacker", ASKS)
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
async def test_no_principal_writes_into_a_gateways_facts_through_a_reply_subject(
    layout: dict[str, Any], attacker: str, keys: Path, secured: str
) -> None:
    await _fresh(keys, secured, layout)
    request, body = ASKS[attacker]
    victim = SUBJECTS.fact("gw-1", "hello")
    async with client_as(keys, secured, attacker) as (nc, errors):
        for _ in range(1000):  # gw-1's whole bound in layout B, 8 times its share in A
            await nc.publish(request, body, reply=victim)
        await nc.flush()
    assert errors == []  # nothing the server saw as a violation
    await _settled(keys, secured, layout)
    # gw-1 itself now says Hello, as its own principal
    async with client_as(keys, secured, "gateway-gw-1") as (gw1, _):
        js = gw1.jetstream(timeout=2)
        ack = await js.publish(victim, b'{"real": true}', headers={"Bc-Type": "hello"})
        assert ack.seq > 0
    # and gw-1's facts are gw-1's own Hello only
    assert await _gw1_facts(keys, secured) == [(victim, "hello")]


async def test_the_reply_subject_is_the_way_in_and_what_is_stored_is_the_servers_answer(
    keys: Path, secured: str
) -> None:
    """Pinned, as it is today: one `$JS.API.INFO` of the `tester` with gw-1's Hello as its
    reply puts the server's account summary into the facts stream under gw-1's subject,
    with no `Bc-Type` (a worker dead-letters it: the payload is not chosen by the asker)."""
    await _fresh(keys, secured, {})
    async with client_as(keys, secured, "tester") as (nc, errors):
        await nc.publish("$JS.API.INFO", b"", reply=SUBJECTS.fact("gw-1", "hello"))
        await nc.flush()
    assert errors == []
    async with client_as(keys, secured, "admin") as (nc, _):
        js = nc.jetstream()
        await asyncio.sleep(0.3)
        msg = await js.get_msg(SUBJECTS.facts_stream, 1)
    assert msg.subject == SUBJECTS.fact("gw-1", "hello")
    assert not (msg.headers or {}).get("Bc-Type")
    assert json.loads(msg.data or b"{}")["type"] == "io.nats.jetstream.api.v1.account_info_response"
