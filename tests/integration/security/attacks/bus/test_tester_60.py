"""Issue 60, item 8: `helm test`'s Pod ran `bcw provision --check` with the migration
Job's `admin` login, which may do anything on the bus. It now logs in as the `tester`
principal: it reads the streams' settings, nothing else.

As `tester`'s own nkey: `bcw provision --check` passes; then every other thing a stolen
test login might try — read a fact or an event, make, change, purge or delete a stream or
a consumer, pull a worker's facts, publish a fact or an event, listen to the events or a
gateway's notices — is refused, and the streams, their messages and consumers are as they
were. In both layouts: **A** one facts stream, **B** a facts stream per gateway."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import ConsumerConfig, StreamConfig

from tests.integration.security.conftest import (
    SUBJECTS,
    client_as,
    fresh_streams,
    got_through,
    violated,
)
from tests.integration.support import bcw

pytestmark = pytest.mark.slow

LAYOUTS: dict[str, dict[str, Any]] = {
    "A-one-stream": {},
    "B-per-gateway": {"facts_gateways": "gw-1,gw-2"},
}


async def _fresh_streams(keys: Path, secured: str, layout: dict[str, Any]) -> None:
    """The streams and the labeler's durable as `bcw provision` makes them, one fact and
    one event in them (the module's server is shared: what was there is deleted first)."""
    async with fresh_streams(keys, secured, layout) as js:
        await js.add_consumer(SUBJECTS.facts_stream, ConsumerConfig(durable_name="labeler"))
        await js.publish(SUBJECTS.fact("gw-1", "hello"), b"{}", headers={"Bc-Type": "hello"})
        await js.publish(SUBJECTS.event("node.connected"), b"{}")


async def _state(keys: Path, secured: str) -> dict[str, tuple[Any, ...]]:
    """Each stream's settings, messages and consumers, as `admin` reads them."""
    async with client_as(keys, secured, "admin") as (nc, _):
        js = nc.jetstream()
        await asyncio.sleep(0.2)  # a gateway's facts reach the sourcing facts stream
        return {
            str(info.config.name): (info.config, info.state.messages, info.state.consumer_count)
            for info in await js.streams_info()
        }


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
async def test_the_test_pods_login_checks_the_streams_and_can_do_nothing_else(
    layout: dict[str, Any], keys: Path, secured: str
) -> None:
    await _fresh_streams(keys, secured, layout)
    before = await _state(keys, secured)
    as_tester = {
        "BCW_NATS_URL": secured,
        "BCW_SUBJECT_ROOT": SUBJECTS.root,
        "BCW_NATS_NKEY_SEED_FILE": str(keys / "tester.nk"),
        "BCW_NATS_FACTS_GATEWAYS": str(layout.get("facts_gateways", "")),
    }
    code, out = await bcw("provision", "--check", **as_tester)
    assert code == 0 and "missing" not in out and "differs" not in out, out

    facts, events = SUBJECTS.facts_stream, SUBJECTS.events_stream
    async with client_as(keys, secured, "tester") as (nc, errors):
        js = nc.jetstream(timeout=0.5)
        heard: list[str] = []

        async def hear(msg: Any) -> None:
            heard.append(msg.subject)

        for subject in (SUBJECTS.all_events, SUBJECTS.all_notices, SUBJECTS.all_facts):
            await nc.subscribe(subject, cb=hear)
        await nc.flush()
        attempts: dict[str, Callable[[], Awaitable[Any]]] = {
            "read a fact": lambda: js.get_msg(facts, 1),
            "read an event": lambda: js.get_msg(events, 1),
            "list the streams": lambda: js.streams_info(),
            "make a consumer": lambda: js.add_consumer(events, ConsumerConfig(durable_name="spy")),
            "read a worker's consumer": lambda: js.consumer_info(facts, "labeler"),
            "delete a worker's consumer": lambda: js.delete_consumer(facts, "labeler"),
            "pull a worker's facts": lambda: _pull(js, facts, "labeler"),
            "purge the facts": lambda: js.purge_stream(facts),
            "delete the events": lambda: js.delete_stream(events),
            "change a stream": lambda: js.update_stream(
                StreamConfig(name=events, subjects=[SUBJECTS.all_events], max_age=1.0)
            ),
            "make a stream": lambda: js.add_stream(StreamConfig(name="MINE", subjects=["mine.>"])),
            "publish a fact": lambda: js.publish(SUBJECTS.fact("gw-1", "hello"), b"{}"),
            "publish an event": lambda: js.publish(SUBJECTS.event("node.connected"), b"{}"),
        }
        assert await got_through(attempts) == []
        assert await violated(errors, "Publish")
        # what another principal owns is as it was, and nothing reaches the test's login
        assert await _state(keys, secured) == before
        async with client_as(keys, secured, "admin") as (admin, _):
            await admin.jetstream().publish(SUBJECTS.event("node.connected"), b"{}")
            await admin.publish(SUBJECTS.notice("gw-1", "dispatch"), b"{}")
            await admin.publish(SUBJECTS.fact("gw-2", "hello"), b"{}")
            await admin.flush()
        await nc.flush()
        await asyncio.sleep(0.2)
        assert heard == []
        assert await violated(errors, "Subscription")


async def _pull(js: Any, stream: str, durable: str) -> None:
    await js._nc.request(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}", b"1", timeout=0.5)
