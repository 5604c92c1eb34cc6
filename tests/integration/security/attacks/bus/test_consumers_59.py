"""Issue 59, findings 10 and 11 (item 8, "Principals own their consumers"), on a real
nats-server that admits only the principals, each attack made with the attacker's own nkey:

- 10: a compromised dashboard (`subscriber`, or another application's `subscriber-<app>`,
  or a gateway) pulls, acks, terminates, deletes or re-creates the `siem` application's
  durable `sub-siem`: every request is refused by the server, and `subscriber-siem` still
  gets all 18 events, none delivered before;
- 11: a gateway's nkey (or a subscriber's) updates its notices consumer (`inactive_threshold`
  1 s), deletes it, or re-creates it with `deliver_subject: bc.revocations` and a 50 ms
  `ack_wait`: refused; the consumer stays as `bcw provision` made it, no message reaches
  the revocations' listeners, and the gateway's notices still wait for it alone.

- the same through a worker's nkey: `worker-liveness` idles out, deletes or re-creates its
  own facts durable `liveness` as a push consumer to `bc.revocations` (a 50 ms ack wait, no
  bound on deliveries; 500 facts once reached every gateway 49,500 times in 5 s): refused,
  its durable stays as `bcw provision` made it, and no fact reaches a revocations listener.

A principal whose consumer is missing or differs, waiting for it: test_consumers_waited_for_59.py.

Setups: A, a new install's (one facts stream, the notices consumers from BCW_NATS_GATEWAYS);
B, the production layout's (a facts stream per gateway, BCW_NATS_FACTS_GATEWAYS, which
`bcw provision` also makes notices consumers for). The proof policy and the relay's place
change nothing here: no database and no relay takes part.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from tests.integration.security.conftest import SUBJECTS, client_as
from tests.integration.support import bcw, eventually
from workers.gateway import notices

pytestmark = pytest.mark.slow

EVENTS, NOTICES = SUBJECTS.events_stream, SUBJECTS.gateway_stream
FACTS = SUBJECTS.facts_stream
SETUPS = {
    "A": {"BCW_NATS_GATEWAYS": "gw-1,gw-2"},
    "B": {"BCW_NATS_FACTS_GATEWAYS": "gw-1,gw-2"},
}


async def provisioned(keys: Path, url: str, **env: str) -> str:
    """Fresh streams, then `bcw provision` as admin with `env`; its output."""
    async with client_as(keys, url, "admin") as (admin, _):
        js = admin.jetstream()
        for stream in await js.streams_info():
            if stream.config.name and stream.config.name.startswith(SUBJECTS.stream_prefix):
                await js.delete_stream(stream.config.name)
    code, output = await bcw(
        "provision",
        BCW_NATS_URL=url,
        BCW_SUBJECT_ROOT=SUBJECTS.root,
        BCW_NATS_NKEY_SEED_FILE=str(keys / "admin.nk"),
        **env,
    )
    assert code == 0, output
    return output


def _create(stream: str, config: dict[str, object]) -> bytes:
    return json.dumps({"stream_name": stream, "config": config}).encode()


def _attacks(
    stream: str, durable: str, filter_subject: str, own: bool = False
) -> list[tuple[str, bytes]]:
    """Every way to take or change a durable another made: pull, ack, nak, terminate
    (not when it is the attacker's `own`: its right, and only its loss), delete, update (a
    1 s inactive threshold: the server deletes it) and re-create it as an amplifier (a
    deliver subject every gateway listens on, a 50 ms ack wait, no bound on deliveries),
    with and without the filter in the request's subject; an ephemeral push consumer
    likewise."""
    api = "$JS.API.CONSUMER"
    flood = {
        "durable_name": durable,
        "name": durable,
        "deliver_subject": SUBJECTS.revocations,
        "ack_policy": "explicit",
        "ack_wait": 50_000_000,
        "max_deliver": -1,
        "filter_subject": filter_subject,
        "deliver_policy": "all",
    }
    idle = {**flood, "inactive_threshold": 1_000_000_000}
    del idle["deliver_subject"]
    ack = f"$JS.ACK.{stream}.{durable}.1.1.1.1.0"
    takes = [
        (f"{api}.MSG.NEXT.{stream}.{durable}", b'{"batch": 100, "expires": 1000000000}'),
        (ack, b"+ACK"),
        (ack, b"-NAK"),
        (ack, b"+TERM"),
    ]
    return [
        *([] if own else takes),
        (f"{api}.DELETE.{stream}.{durable}", b""),
        (f"{api}.CREATE.{stream}.{durable}", _create(stream, idle)),
        (f"{api}.CREATE.{stream}.{durable}.{filter_subject}", _create(stream, idle)),
        (f"{api}.CREATE.{stream}.{durable}", _create(stream, flood)),
        (f"{api}.CREATE.{stream}.{durable}.{filter_subject}", _create(stream, flood)),
        (f"{api}.DURABLE.CREATE.{stream}.{durable}", _create(stream, flood)),
        (f"{api}.CREATE.{stream}", _create(stream, {**flood, "durable_name": None})),
    ]


async def _attack(keys: Path, url: str, principal: str, attempts: list[tuple[str, bytes]]) -> None:
    """Make every attempt as `principal`; each must be refused by the server (it says so,
    naming the subject), none answered."""
    async with client_as(keys, url, principal) as (nc, errors):
        answers: list[Msg] = []
        inbox = nc.new_inbox()

        async def answered(msg: Msg) -> None:
            answers.append(msg)

        await nc.subscribe(f"{inbox}.*", cb=answered)
        for i, (subject, payload) in enumerate(attempts):
            await nc.publish(subject, payload, reply=f"{inbox}.{i}")
        await nc.flush()

        async def all_refused() -> bool:
            said = " ".join(errors).lower()
            return all(f'"{subject.lower()}"' in said for subject, _ in attempts)

        await eventually(all_refused, what=f"{principal}'s attempts refused")
        await asyncio.sleep(0.3)  # an answer would be here by now
        assert answers == [], [(a.subject, a.data) for a in answers]
        # and through the client's own API, as a dashboard's code would try it
        js = nc.jetstream(timeout=1.0)
        stream, durable = next(s for s, _ in attempts if ".DELETE." in s).split(".")[-2:]
        with pytest.raises(nats.errors.TimeoutError):
            await js.delete_consumer(stream, durable)
        with pytest.raises(nats.errors.TimeoutError):
            await js.add_consumer(
                stream, ConsumerConfig(durable_name=durable, deliver_subject=SUBJECTS.revocations)
            )


async def _publish_events(keys: Path, url: str, count: int) -> None:
    async with client_as(keys, url, "admin") as (admin, _):
        js = admin.jetstream()
        for i in range(count):
            await js.publish(
                SUBJECTS.event("node.connected"),
                json.dumps({"nodeId": f"n{i}", "epoch": 1}).encode(),
                headers={"Bc-Type": "node.connected", "Nats-Msg-Id": f"siem-{i}"},
            )


@pytest.mark.parametrize("attacker", ["subscriber", "subscriber-dashboards", "gateway-gw-1"])
async def test_no_other_principal_drains_a_subscriber_applications_durable(
    keys: Path, secured: str, attacker: str
) -> None:
    """Finding 10: the `siem` application's 18 events, in its own durable `sub-siem`
    (made by `bcw provision`), all reach `subscriber-siem` however the attacker tried to
    pull, ack, terminate, delete or re-create that durable; an operator's own durable
    (`siem`, made by hand) is as out of reach."""
    output = await provisioned(keys, secured, BCW_NATS_SUBSCRIBERS="siem,dashboards", **SETUPS["A"])
    assert "consumer sub-siem" in output and "consumer sub-dashboards" in output, output
    async with client_as(keys, secured, "admin") as (admin, _):  # an operator's, by hand
        await admin.jetstream().add_consumer(
            EVENTS, ConsumerConfig(durable_name="siem", ack_policy=AckPolicy.EXPLICIT)
        )
    await _publish_events(keys, secured, 18)
    everything = SUBJECTS.event("node.connected")
    await _attack(keys, secured, attacker, _attacks(EVENTS, "sub-siem", everything))
    await _attack(keys, secured, attacker, _attacks(EVENTS, "siem", everything))

    async with client_as(keys, secured, "admin") as (admin, _):
        js = admin.jetstream()
        for durable in ("sub-siem", "siem"):
            info = await js.consumer_info(EVENTS, durable)
            assert info.num_pending == 18 and info.num_ack_pending == 0, (durable, info)
            assert info.delivered.consumer_seq == 0 and info.config.deliver_subject is None
            assert info.config.inactive_threshold is None
    async with client_as(keys, secured, "subscriber-siem") as (nc, errors):
        pulled = await nc.jetstream(timeout=2.0).pull_subscribe_bind("sub-siem", EVENTS)
        got: list[Msg] = []
        while len(got) < 18:
            batch = await pulled.fetch(18 - len(got), timeout=5)
            for msg in batch:
                await msg.ack_sync()
            got += batch
        assert sorted(m.metadata.sequence.stream for m in got) == list(range(1, 19))
        assert all(m.metadata.num_delivered == 1 for m in got)  # first delivery, to its owner
        assert errors == []


@pytest.mark.parametrize("setup", ["A", "B"])
@pytest.mark.parametrize("attacker", ["gateway-gw-1", "subscriber-siem"])
async def test_a_notices_consumer_cannot_be_made_an_amplifier(
    keys: Path, secured: str, setup: str, attacker: str
) -> None:
    """Finding 11: gw-1's nkey (or a subscriber application's) tries to idle out, delete
    and re-create gw-1's notices consumer (and gw-2's) with the revocations as deliver
    subject, a 50 ms ack wait and no bound on deliveries. Nothing changes: both consumers
    are as `bcw provision` made them, not a message reaches a revocations listener nor
    lands in the events stream, and gw-1's three notices wait for gw-1's pulls alone."""
    output = await provisioned(keys, secured, BCW_NATS_SUBSCRIBERS="siem", **SETUPS[setup])
    assert "consumer gw-gw-1" in output and "consumer gw-gw-2" in output, output
    async with client_as(keys, secured, "admin") as (admin, _):
        js = admin.jetstream()
        for i in range(3):
            await js.publish(
                SUBJECTS.notice("gw-1", "zombie"),
                b"{}",
                headers={"Bc-Type": "zombie", "Nats-Msg-Id": f"z-{i}"},
            )
        before = {d: (await js.consumer_info(NOTICES, d)).config for d in ("gw-gw-1", "gw-gw-2")}
        events_before = (await js.stream_info(EVENTS)).state.messages
    async with client_as(keys, secured, "gateway-gw-2") as (listener, _):
        heard: list[Msg] = []

        async def hear(msg: Msg) -> None:
            heard.append(msg)

        await listener.subscribe(SUBJECTS.revocations, cb=hear)
        for gateway in ("gw-1", "gw-2"):
            own = SUBJECTS.gateway_notices(gateway).replace(">", "zombie")
            mine = attacker == f"gateway-{gateway}"
            attempts = _attacks(NOTICES, f"gw-{gateway}", own, mine)
            await _attack(keys, secured, attacker, attempts)
        await asyncio.sleep(1.5)  # past the 1 s threshold the attacker asked for
        assert heard == []

    async with client_as(keys, secured, "admin") as (admin, _):
        js = admin.jetstream()
        for durable, config in before.items():
            info = await js.consumer_info(NOTICES, durable)
            assert info.config == config, durable
            assert info.config.deliver_subject is None and info.config.ack_wait == 30.0
        info = await js.consumer_info(NOTICES, "gw-gw-1")
        assert info.num_pending == 3 and info.delivered.consumer_seq == 0
        assert (await js.stream_info(EVENTS)).state.messages == events_before
        wanted = notices.consumer_config(SUBJECTS, "gw-1")
        assert (info.config.max_deliver, info.config.filter_subject) == (
            wanted.max_deliver,
            wanted.filter_subject,
        )


@pytest.mark.parametrize("setup", ["A", "B"])
async def test_a_worker_cannot_make_its_facts_durable_an_amplifier(
    keys: Path, secured: str, setup: str
) -> None:
    """`worker-liveness` tries to idle out (1 s), delete and re-create its own durable
    `liveness` with the revocations as deliver subject; then a gateway sends 50 facts the
    durable takes. Nothing changes: the durable is as `bcw provision` made it, holds the 50
    facts for the liveness worker's pulls, and no message reaches a revocations listener."""
    output = await provisioned(keys, secured, **SETUPS[setup])
    assert "consumer liveness" in output, output
    async with client_as(keys, secured, "admin") as (admin, _):
        before = (await admin.jetstream().consumer_info(FACTS, "liveness")).config
    async with client_as(keys, secured, "gateway-gw-1") as (listener, _):
        heard: list[Msg] = []

        async def hear(msg: Msg) -> None:
            heard.append(msg)

        await listener.subscribe(SUBJECTS.revocations, cb=hear)
        await listener.flush()
        own = SUBJECTS.fact_filter("liveness")
        await _attack(keys, secured, "worker-liveness", _attacks(FACTS, "liveness", own, True))
        await asyncio.sleep(1.5)  # past the 1 s threshold the attacker asked for
        async with client_as(keys, secured, "gateway-gw-2") as (gateway, _):
            js = gateway.jetstream()
            for i in range(50):
                await js.publish(
                    SUBJECTS.fact("gw-2", "liveness"), b"{}", headers={"Nats-Msg-Id": f"l-{i}"}
                )

        async def all_held() -> bool:
            async with client_as(keys, secured, "admin") as (admin, _):
                info = await admin.jetstream().consumer_info(FACTS, "liveness")
                return info.num_pending == 50

        await eventually(all_held, what="the 50 facts held by the durable")
        await asyncio.sleep(0.5)
        assert heard == []
    async with client_as(keys, secured, "admin") as (admin, _):
        info = await admin.jetstream().consumer_info(FACTS, "liveness")
        assert info.config == before
        assert info.config.deliver_subject is None and info.config.inactive_threshold is None
        assert info.delivered.consumer_seq == 0 and info.num_ack_pending == 0
