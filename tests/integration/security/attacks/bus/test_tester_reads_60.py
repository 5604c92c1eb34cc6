"""Issue 60, item 8 (the `tester` principal), attacked further than
`test_tester_60.py`: the test login tries to read what it should not by the requests its
grants do not name, by other principals' inboxes, and by what its one grant
(`$JS.API.STREAM.INFO.<stream>`) answers to a crafted body.

Held: `_INBOX.>`, a worker's inbox and the operator's are refused to it and nothing of a
worker's pulled fact reaches it; `DIRECT.GET`, `STREAM.MSG.GET` (with a subject filter or
`last_by_subj`), `CONSUMER.INFO`/`CONSUMER.LIST`/`CONSUMER.NAMES`, `STREAM.LIST` and
`STREAM.NAMES` are refused.

As it is (a residual docs/kubernetes.md undersays: "settings and counts"): a
`STREAM.INFO` body with `subjects_filter` lists every subject a stream holds with its
count — in the one facts stream, every gateway's id and how many facts of each type it
has sent; in the notices stream every gateway that was sent a notice — the listing the
gateway principal was denied `STREAM.INFO` for."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.integration.security.conftest import (
    SUBJECTS,
    answered,
    client_as,
    fresh_streams,
    violated,
)
from workers.runtime.bus import principals

pytestmark = pytest.mark.slow


async def _fresh(keys: Path, secured: str) -> None:
    async with fresh_streams(keys, secured) as js:
        await js.add_consumer(
            SUBJECTS.facts_stream,
            ConsumerConfig(durable_name="labeler", ack_policy=AckPolicy.EXPLICIT),
        )
        for gateway, kind in (("gw-1", "hello"), ("gw-2", "hello"), ("gw-2", "liveness")):
            await js.publish(
                SUBJECTS.fact(gateway, kind), b'{"secret": 1}', headers={"Bc-Type": kind}
            )
        await js.publish(SUBJECTS.notice("gw-2", "dispatch"), b"{}")


def _inbox(keys: Path, principal: str) -> str:
    seed = (keys / f"{principal}.nk").read_bytes().strip()
    return principals.inbox_prefix(principals.public_key(seed)) + ".>"


async def test_the_test_login_hears_no_inbox_but_its_own_and_reads_no_message(
    keys: Path, secured: str
) -> None:
    await _fresh(keys, secured)
    facts = SUBJECTS.facts_stream
    async with client_as(keys, secured, "tester") as (nc, errors):
        heard: list[str] = []

        async def hear(msg: Any) -> None:
            heard.append(msg.subject)

        for subject in ("_INBOX.>", _inbox(keys, "worker-labeler"), _inbox(keys, "operator")):
            await nc.subscribe(subject, cb=hear)
        await nc.flush()
        # the labeler pulls a fact: its reply comes to its inbox
        async with client_as(keys, secured, "worker-labeler") as (worker, _):
            pulled = await worker.request(
                f"$JS.API.CONSUMER.MSG.NEXT.{facts}.labeler",
                b'{"batch": 1}',
                timeout=2,
                old_style=True,  # the fact comes under its own subject, to the inbox
            )
            assert pulled.data == b'{"secret": 1}'
        await asyncio.sleep(0.2)
        assert heard == []
        assert await violated(errors, "Subscription")
        asks = {
            f"$JS.API.DIRECT.GET.{facts}": {"seq": 1},
            f"$JS.API.DIRECT.GET.{facts}.{SUBJECTS.fact('gw-1', 'hello')}": {},
            f"$JS.API.STREAM.MSG.GET.{facts}": {"last_by_subj": SUBJECTS.fact("gw-1", "hello")},
            f"$JS.API.STREAM.MSG.GET.{SUBJECTS.events_stream}": {"seq": 1},
            f"$JS.API.CONSUMER.INFO.{facts}.labeler": {},
            f"$JS.API.CONSUMER.LIST.{facts}": {},
            f"$JS.API.CONSUMER.NAMES.{facts}": {},
            "$JS.API.STREAM.LIST": {},
            "$JS.API.STREAM.NAMES": {},
        }
        assert await answered(nc, asks, within=0.5) == []
        assert await violated(errors, "Publish")


async def test_stream_info_with_a_subject_filter_lists_every_gateway(
    keys: Path, secured: str
) -> None:
    await _fresh(keys, secured)
    async with client_as(keys, secured, "tester") as (nc, _):
        listed: dict[str, int] = {}
        for stream in (SUBJECTS.facts_stream, SUBJECTS.gateway_stream):
            answer = await nc.request(
                f"$JS.API.STREAM.INFO.{stream}", b'{"subjects_filter": ">"}', timeout=2
            )
            listed |= json.loads(answer.data)["state"]["subjects"]
    assert listed == {
        SUBJECTS.fact("gw-1", "hello"): 1,
        SUBJECTS.fact("gw-2", "hello"): 1,
        SUBJECTS.fact("gw-2", "liveness"): 1,
        SUBJECTS.notice("gw-2", "dispatch"): 1,
    }
