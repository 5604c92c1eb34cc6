"""A compromised gateway's takeover, at each policy, with all five workers running for
longer than `BCW_QUARANTINE_HOLD_MAX` (issue #58, "no downgrade, secure by default"); and
the rolled-back probe, then the takeover of a node with a command in flight.

gw-1 is the attacker (its own bound login, the reference gateway's code, no node's key);
gw-2 is honest. Each node has a command waiting with a secret in it, and gw-1 says an
unproven Hello for it:

- `offline`: the node's daemon had closed its session;
- `live`: the node is connected to gw-2;
- `revoked`: the node's certificate was revoked (gw-1 presents a fresh serial with no
  record: refused at every policy, the revoked generation admits none — issue #59); the
  real machine is re-joined with a new one;
- `keyless`: a live node that never enrolled a Hello key (a fleet moving to proofs).

What the attacker's session gets: nothing for a node with a key, whatever the policy —
no command, no label, no revocation, no count; its Hello is held and said. At `require`
nothing opens at all. A node without a key is what `warn` and `off` still leave open
(docs/kubernetes.md, "What a compromised gateway can still do"): its commands go to the
attacker's session. What the honest node gets: its commands, once its daemon says Hello
again (proven) — from the same boot, or the re-joined machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.proof import prove
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.security.conftest import url_as
from tests.integration.security.gateways.test_compromised_gateway import (
    _forged,
    _hello_as_gw1,
    _honest,
)
from tests.integration.security.gateways.test_compromised_gateway import (
    _gateways as _keyed_gateways,
)
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, make_settings, running, stream_messages
from workers.gateway import Code, Gateway, GatewaySettings, HelloRequest, Refused, store
from workers.registry import WORKERS
from workers.replay.commands import enqueue_command as enqueue
from workers.replay.settings import ReplaySettings
from workers.runtime.bus import streams
from workers.runtime.store import migrate
from workers.settings import Settings

pytestmark = pytest.mark.slow

#: the hold bound of this test: its run lasts more than twice as long
HOLD_MAX = timedelta(seconds=1.5)
CASES = ("offline", "live", "revoked", "keyless")


def five_workers(settings: Settings) -> Settings:
    """The five workers' settings, with a hold bound of `HOLD_MAX` looked at every 0.2 s."""
    return settings.model_copy(
        update={
            "replay": ReplaySettings(hello_check_interval=0.2, hold_max=HOLD_MAX),
        }
    )


def _request(
    node: str, boot: str, serial: str | None = None, gateway: str | None = None
) -> HelloRequest:
    """`node`'s Hello from boot `boot`: proven for `gateway` when given (its own daemon,
    by its key), unproven otherwise (the attacker, who has no key)."""
    proof = None
    if gateway is not None:
        proof = prove(fleet.hello_key(node), node, boot, "j1", gateway, fleet.rising_at(node))
    return HelloRequest(
        node_id=node,
        cert_serial=serial or f"{node}-serial",
        role="worker",
        boot_id=boot,
        journal_id="j1",
        proof=proof,
        capabilities=["evil.cap"] if gateway is None else ["real.cap"],
    )


@contextlib.asynccontextmanager
async def _gateways(
    logins: dict[str, str], nc: NATS, subjects: Subjects, db: asyncpg.Connection
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """(attacker gw-1, honest gw-2), each under its own bound login."""
    await streams.provision_streams(nc.jetstream(), subjects)
    with contextlib.suppress(asyncpg.DuplicateObjectError):
        await db.execute("CREATE ROLE gw2_login_t LOGIN IN ROLE bcw_gateway_bound")
    await store.bind(db, "gw2_login_t", "gw-2")
    async with contextlib.AsyncExitStack() as stack:
        started = []
        for gateway_id, url in (
            ("gw-1", logins["bcw_gateway_bound"]),
            ("gw-2", url_as(logins["bcw_gateway_bound"], "gw2_login_t")),
        ):
            pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
            stack.push_async_callback(pool.close)
            gateway = Provisioned(
                gateway_id, pool, nc, subjects, settings=GatewaySettings(verdict_wait=0.5)
            )
            await gateway.start(autotick=None)
            stack.push_async_callback(gateway.stop, graceful=False)
            started.append(gateway)
        yield started[0], started[1]


async def _before_the_attack(
    db: asyncpg.Connection, honest: Gateway, policy: str
) -> dict[str, object]:
    """Each case's node as the attack finds it, with a command waiting (its secret in it).
    The keyless node's daemon proves nothing: at `require` it cannot connect at all."""
    for node in CASES:
        await fleet.join(db, node, key=node != "keyless")
        if node != "keyless":
            await honest.hello(_request(node, f"{node}-boot", gateway="gw-2"), RecordingStream())
        elif policy != "require":
            await honest.hello(_request(node, f"{node}-boot", "keyless-serial"), RecordingStream())
    await honest.disconnect("offline", 1)  # its daemon closed the session
    await db.execute(
        "UPDATE node_certs SET revoked_at = now(), revocation_reason = 'stolen' "
        "WHERE serial = 'revoked-serial'"
    )
    await honest.disconnect("revoked", 1)  # its revocation closed it
    return {node: await enqueue(db, node, "exec", {"secret": f"{node}-s3cr3t"}) for node in CASES}


@pytest.mark.parametrize("policy", ["off", "warn", "require"])
async def test_a_takeover_gets_nothing_of_a_node_with_a_key_and_the_node_gets_its_commands(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    policy: str,
) -> None:
    await migrate.set_hello_proof(db, policy)
    settings = five_workers(make_settings(servers.nats_url, database_url, subjects))
    async with (
        _gateways(logins, nc, subjects, db) as (attacker, honest),
        running(settings, [build(settings) for build in WORKERS.values()]),
    ):
        commands = await _before_the_attack(db, honest, policy)
        # the attack: an unproven Hello for each, the revoked one under a fresh serial
        taken: dict[str, RecordingStream] = {}
        for node in CASES:
            stream = RecordingStream()
            serial = "fresh-unrecorded" if node == "revoked" else None
            try:
                await attacker.hello(_request(node, "evil-boot", serial), stream)
            except Refused as refused:
                assert policy == "require" or node == "revoked", node
                assert refused.code is Code.UNAUTHENTICATED, node
                continue
            taken[node] = stream
        opened = sorted(set(CASES) - {"revoked"})  # a revoked generation: no unrecorded serial
        assert sorted(taken) == ([] if policy == "require" else opened)
        started = time.monotonic()
        if "keyless" in taken:  # what warn and off leave open: a node without a key
            await eventually(lambda: _got(taken["keyless"]), what="the keyless node's command")
        await asyncio.sleep(
            max(0.0, 2 * HOLD_MAX.total_seconds() + 1 - (time.monotonic() - started))
        )
        # the attacker's sessions of nodes with a key: nothing, past the hold bound
        for node in ("offline", "live", "revoked"):
            if node in taken:
                assert taken[node].delivered == [], node
                assert taken[node].dropped == [], node  # not even told to go: held quietly
        assert await _notices_to(nc, subjects, "gw-1") == (
            [str(commands["keyless"])] if "keyless" in taken else []
        )
        keyed = await db.fetch(
            "SELECT node_id, proven, held_epoch IS NOT NULL AS held FROM node_sessions "
            "WHERE node_id <> 'keyless' AND gateway_id = 'gw-1' ORDER BY node_id"
        )
        assert [tuple(r) for r in keyed] == (
            [] if policy == "require" else [(n, False, True) for n in ("live", "offline")]
        )
        assert await _evil_labels(db) == (["keyless"] if "keyless" in taken else [])
        assert (
            await db.fetchval("SELECT count(*) FROM node_certs WHERE revoked_at IS NOT NULL") == 1
        )  # only what was revoked before the attack
        said = await _events(nc, subjects, "security.node.unproven-hello")
        assert sorted(said) == ([] if policy == "require" else ["live", "offline"])

        # the honest nodes: each daemon says Hello again (proven), and gets its commands
        await fleet.join(db, "revoked", "revoked-serial-2")  # the real machine, re-joined
        mine: dict[str, RecordingStream] = {}
        for node in ("offline", "live", "revoked"):
            mine[node] = RecordingStream()
            serial = "revoked-serial-2" if node == "revoked" else None
            await honest.hello(_request(node, f"{node}-boot", serial, "gw-2"), mine[node])
        for node, stream in mine.items():
            await eventually(lambda s=stream: _got(s), what=f"{node}'s command")  # type: ignore[misc]
            assert [d.command_id for d in stream.delivered] == [commands[node]], node
            assert stream.delivered[0].payload == {"secret": f"{node}-s3cr3t"}


async def _got(stream: RecordingStream) -> bool:
    return bool(stream.delivered)


async def _evil_labels(db: asyncpg.Connection) -> list[str]:
    """The nodes labeled with the capability only the attacker's Hellos claim."""
    rows = await db.fetch(
        "SELECT node_id FROM node_labels WHERE key = 'bc.dev/cap.evil.cap' ORDER BY node_id"
    )
    return [r["node_id"] for r in rows]


async def _notices_to(nc: NATS, subjects: Subjects, gateway: str) -> list[str]:
    """The command ids of the dispatch notices the workers sent `gateway`."""
    notices = await stream_messages(nc.jetstream(), subjects.gateway_stream)
    return [
        str(json.loads(m.data)["command_id"])
        for m in notices
        if m.subject.split(".")[2] == gateway and m.headers and m.headers["Bc-Type"] == "dispatch"
    ]


async def _events(nc: NATS, subjects: Subjects, bc_type: str) -> list[str]:
    """The node ids of the events of type `bc_type`."""
    events = await stream_messages(nc.jetstream(), subjects.events_stream)
    return [
        json.loads(m.data)["nodeId"]
        for m in events
        if m.headers and m.headers["Bc-Type"] == bc_type
    ]


@pytest.mark.parametrize("policy", ["require", "warn", "off"])
async def test_a_rolled_back_probe_learns_nothing_and_a_takeover_gets_no_command(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    policy: str,
) -> None:
    """With all five workers running, for longer than the hold bound: the probe tells
    nothing; the takeover of n1 (live at gw-2, a command in flight and one waiting) is
    refused at `require`, and otherwise held for good (n1 proves its Hellos): no command
    reaches gw-1, and n1's daemon, saying Hello again, gets both."""
    await migrate.set_hello_proof(db, policy)
    async with _keyed_gateways(logins, nc, subjects, db, ["n1"]) as (attacker, honest):
        settings = five_workers(make_settings(servers.nats_url, database_url, subjects))
        async with running(settings, [build(settings) for build in WORKERS.values()]):
            first = await enqueue(db, "n1", "exec", {"secret": "s3cr3t"})

            async def dispatched() -> bool:
                state = await db.fetchval("SELECT state FROM commands WHERE command_id = $1", first)
                return bool(state == "dispatched")

            await eventually(dispatched, what="the command in flight at gw-2")
            # 1. the probe: a Hello transaction rolled back tells nothing of the node
            conn = await asyncpg.connect(logins["bcw_gateway_bound"])
            try:
                tx = conn.transaction()
                await tx.start()
                row = await _hello_as_gw1(conn, "n1")
                await tx.rollback()
            finally:
                await conn.close()
            assert set(row.keys()) == {
                "outcome",
                "epoch",
                "session_id",
                "acked_event_seq",
                "duplicate",
                "proven",
                "inventory",
            }
            assert "n1-boot" not in json.dumps(dict(row), default=str)
            # 2. the takeover, with the command in flight and a second one waiting
            second = await enqueue(db, "n1", "exec", {"secret": "s3cr3t-2"})
            stream = RecordingStream()
            if policy == "require":
                with pytest.raises(Refused) as refused:
                    await attacker.hello(_forged("n1", "guess"), stream)
                assert refused.value.code is Code.UNAUTHENTICATED
            else:  # opens, unproven for a node that proves: a takeover attempt, held for good
                await attacker.hello(_forged("n1", "guess"), stream)
                row = await db.fetchrow("SELECT held_epoch, proven FROM node_sessions")
                assert tuple(row) == (2, False)
            # the replay, the quarantine's count, dispatch rounds, the hold bound's looks
            await asyncio.sleep(2 * HOLD_MAX.total_seconds() + 1)
            notices = await stream_messages(nc.jetstream(), subjects.gateway_stream)
            to_attacker = [m for m in notices if m.subject.split(".")[2] == "gw-1"]
            assert [m.headers["Bc-Type"] for m in to_attacker if m.headers] == []
            assert stream.delivered == []
            states = {
                r["command_id"]: (r["state"], r["session_epoch"])
                for r in await db.fetch("SELECT command_id, state, session_epoch FROM commands")
            }
            # nothing moved: the first still at gw-2's epoch (refused at require; a takeover
            # attempt's Hello below it applies no resume rule and replays nothing)
            assert states[first] == ("dispatched", 1)
            assert states[second][0] in ("pending", "dispatched")
            assert states[second] != ("dispatched", 2)
            # 3. n1's daemon says Hello again: it gets both, whatever the policy
            mine = RecordingStream()
            await honest.hello(_honest("n1"), mine)

            async def both() -> bool:
                return {d.command_id for d in mine.delivered} == {first, second}

            await eventually(both, what="n1's two commands at its own session")
