"""Hidden clones (issue #59, items 3 and 12): a gateway that says "no duplicate" for a
clone, or never says its Hello at all, on real servers — each gateway logged in to the
database as itself and to the bus with its own nkey, each worker as its own principal.

gw-1 is the attacker's gateway (the reference gateway's code, its facts rewritten or
dropped before they leave); gw-2 is honest. n1 proves its Hellos; its clone holds n1's
stolen Hello key (so its Hellos are proven), and dials gw-1. Two setups: A, what a new
install gets at `warn` (one facts stream); B, the production layout (`require`, a facts
stream per gateway).

- `test_a_clone_said_as_no_duplicate_is_counted_revoked_and_blamed_on_its_gateway`: the
  clone's Hellos, recorded duplicates by their transaction, are published saying
  `duplicate: false`. Every one is counted (the record decides, not the fact): revoked at
  the fourth proven alternation, blamed on gw-1 (the honest reconnect that completed the
  count is gw-2's), nothing released by the hold bound, nothing sent after the revocation.
- `test_a_clone_whose_hello_fact_never_comes_gets_nothing_and_the_node_gets_its_commands`:
  gw-1 never publishes the clone's Hello fact. Past the hold bound, with the quarantine
  alive and past the time the fact was due, the clone's session is still held: the
  secret waits. n1's daemon says Hello again at gw-2: the clone's Hello is counted from
  its record with it, and the secret goes to n1.

The quarantine alone, counting from the record: test_counted_from_the_record_59.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from schemas.facts import Fact, Hello, PreviousSession
from schemas.proof import prove
from tests.conftest import Clock
from tests.integration import fleet
from tests.integration.security.conftest import (
    SUBJECTS,
    client_as,
    nats_as,
    provision_consumers,
    url_as,
)
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, make_settings, running
from workers import replay
from workers.embedded.servers import EmbeddedNats
from workers.gateway import Gateway, GatewaySettings, HelloRequest, Refused, notices, store
from workers.registry import WORKERS
from workers.replay.commands import enqueue_command as enqueue
from workers.replay.settings import ReplaySettings
from workers.runtime.bus import connection, streams
from workers.runtime.effects.worker import Runtime
from workers.runtime.store import migrate
from workers.settings import Settings

pytestmark = pytest.mark.slow

SETUPS = {"A": ("warn", ""), "B": ("require", "gw-1,gw-2")}


@pytest.fixture
def secured(keys: Path, tmp_path: Path) -> Iterator[str]:
    """A server of the principals for each test: one setup's streams are not another's."""
    conf = keys / "server.conf"
    conf.write_text('include "auth.conf"\n')
    server = EmbeddedNats(tmp_path, extra=["-c", str(conf)]).start()
    yield server.url
    server.stop()


@dataclasses.dataclass
class World:
    attacker: Gateway
    honest: Gateway
    runtimes: dict[str, Runtime]


def _request(boot: str, gateway: str) -> HelloRequest:
    """n1's Hello from `boot`, proven for `gateway` by n1's key (the clone stole it)."""
    proof = prove(fleet.hello_key("n1"), "n1", boot, "j1", gateway, fleet.rising_at("n1"))
    return HelloRequest(
        node_id="n1",
        cert_serial="n1-serial",
        role="worker",
        boot_id=boot,
        journal_id="j1",
        proof=proof,
    )


def _settings(secured: str, database_url: str, hold_max: timedelta, gateways: str) -> Settings:
    base = make_settings(secured, database_url, SUBJECTS)
    return base.model_copy(
        update={
            "replay": ReplaySettings(hello_check_interval=0.2, hold_max=hold_max),
            "nats": base.nats.model_copy(update={"facts_gateways": gateways}),
        }
    )


@contextlib.asynccontextmanager
async def _world(
    keys: Path,
    secured: str,
    logins: dict[str, str],
    database_url: str,
    db: asyncpg.Connection,
    setup: str,
    hold_max: timedelta,
) -> AsyncIterator[World]:
    policy, gateways = SETUPS[setup]
    await migrate.set_hello_proof(db, policy)
    settings = _settings(secured, database_url, hold_max, gateways)
    admin = nats_as(keys, secured, "admin").model_copy(update={"facts_gateways": gateways})
    async with client_as(keys, secured, "admin") as (nc, _):
        js = nc.jetstream()
        await streams.provision_streams(js, SUBJECTS, limits=streams.limits_of(admin))
        for gateway_id in ("gw-1", "gw-2"):  # as `bcw provision` does (BCW_NATS_GATEWAYS)
            await notices.provision(js, SUBJECTS, gateway_id)
    await provision_consumers(keys, secured, settings)  # the workers' durables
    with contextlib.suppress(asyncpg.DuplicateObjectError):
        await db.execute("CREATE ROLE gw2_login_t LOGIN IN ROLE bcw_gateway_bound")
    await store.bind(db, "gw2_login_t", "gw-2")
    await fleet.join(db, "n1")
    async with contextlib.AsyncExitStack() as stack:
        runtimes = {}
        for name in sorted(WORKERS):
            own = nats_as(keys, secured, f"worker-{name}").model_copy(
                update={"facts_gateways": gateways}
            )
            worker = settings.model_copy(update={"nats": own})
            runtimes[name], _ = await stack.enter_async_context(
                running(worker, [WORKERS[name](worker)])
            )
        started = []
        for gateway_id, url in (
            ("gw-1", logins["bcw_gateway_bound"]),
            ("gw-2", url_as(logins["bcw_gateway_bound"], "gw2_login_t")),
        ):
            pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
            stack.push_async_callback(pool.close)
            bus = await connection.connect(
                nats_as(keys, secured, f"gateway-{gateway_id}"), name=gateway_id
            )
            stack.push_async_callback(bus.close)
            gateway = Gateway(
                gateway_id,
                pool,
                bus,
                SUBJECTS,
                settings=GatewaySettings(verdict_wait=0.5, lease_ttl=300.0),
            )
            await gateway.start(autotick=None)
            stack.push_async_callback(gateway.stop, False)
            started.append(gateway)
        yield World(started[0], started[1], runtimes)


def _lies(gateway: Gateway) -> None:
    """gw-1's Hello facts say "no duplicate", whatever their transaction recorded."""
    build = gateway.facts.hello

    def hello(*args: Any, **kwargs: Any) -> Hello:
        fact = build(*args, **kwargs)
        return fact.model_copy(
            update={"duplicate": False, "previous": PreviousSession(epoch=fact.epoch - 1)}
        )

    gateway.facts.hello = hello  # type: ignore[method-assign]


def _withholds(gateway: Gateway) -> None:
    """gw-1 never publishes a Hello fact (its other facts go out)."""
    publish = gateway.facts.publish

    async def withheld(fact: Fact) -> None:
        if not isinstance(fact, Hello):
            await publish(fact)

    gateway.facts.publish = withheld  # type: ignore[method-assign]


async def _counted(db: asyncpg.Connection, n: int) -> bool:
    return await db.fetchval("SELECT count(*) FROM node_alternations WHERE node_id = 'n1'") == n


async def _state(db: asyncpg.Connection, command: Any) -> str:
    return str(await db.fetchval("SELECT state FROM commands WHERE command_id = $1", command))


@pytest.mark.parametrize("setup", sorted(SETUPS))
async def test_a_clone_said_as_no_duplicate_is_counted_revoked_and_blamed_on_its_gateway(
    keys: Path,
    secured: str,
    logins: dict[str, str],
    database_url: str,
    db: asyncpg.Connection,
    setup: str,
) -> None:
    async with _world(keys, secured, logins, database_url, db, setup, timedelta(seconds=1)) as w:
        _lies(w.attacker)
        mine = RecordingStream()
        await w.honest.hello(_request("b1", "gw-2"), mine)  # epoch 1: n1, at gw-2
        first = await enqueue(db, "n1", "exec", {"secret": "s3cr3t-1"})
        await eventually(lambda: _is(db, first, "dispatched"), what="n1's command at gw-2")
        streams_: list[RecordingStream] = []
        refused: list[str] = []
        for turn in range(2):
            clone = RecordingStream()
            streams_.append(clone)
            await w.attacker.hello(_request("clone-boot", "gw-1"), clone)
            await eventually(
                lambda t=turn: _counted(db, 2 * t + 1),
                what="the clone's Hello counted (said: no duplicate)",
            )
            again = RecordingStream()
            streams_.append(again)
            try:  # n1's daemon, its session superseded, says Hello again at gw-2
                await w.honest.hello(_request("b1", "gw-2"), again)
            except Refused as error:
                refused.append(str(error))
            await eventually(lambda t=turn: _counted(db, 2 * t + 2), what="n1's Hello counted")
        recorded = await db.fetch(
            "SELECT epoch, gateway_id, duplicate FROM session_epochs WHERE node_id = 'n1' "
            "AND epoch > 1 ORDER BY epoch"
        )
        counted = await db.fetch(
            "SELECT epoch, gateway_id, proven FROM node_alternations WHERE node_id = 'n1' "
            "ORDER BY epoch"
        )
        assert [tuple(r) for r in recorded] == [
            (2, "gw-1", True),
            (3, "gw-2", True),
            (4, "gw-1", True),
            (5, "gw-2", True),
        ]
        assert [tuple(r) for r in counted] == [
            (2, "gw-1", True),
            (3, "gw-2", True),
            (4, "gw-1", True),
            (5, "gw-2", True),
        ]

        async def revoked() -> bool:
            return bool(await db.fetchval("SELECT is_revoked('n1-serial')"))

        await eventually(revoked, what="n1-serial revoked at the fourth proven alternation")
        quarantine = await db.fetchrow(
            "SELECT epoch, gateway_id, gateways, held, revoked_at FROM quarantines"
        )
        assert (quarantine["epoch"], quarantine["gateway_id"], quarantine["held"]) == (
            5,
            "gw-1",
            None,
        ), dict(quarantine)
        assert sorted(quarantine["gateways"]) == ["gw-1", "gw-2"]
        # nothing released by the hold bound; the fourth's session, and after the
        # revocation any session, gets nothing
        last = await enqueue(db, "n1", "exec", {"secret": "s3cr3t-2"})
        await asyncio.sleep(1.5)  # several looks of the hold bound (every 0.2 s)
        assert w.runtimes["replay"].metrics.of(replay.HoldMetrics).holds_expired.value() == 0
        assert streams_[-1].delivered == []
        assert await _state(db, last) == "pending"
        assert [d for s in streams_ for d in s.delivered if str(d.command_id) == str(last)] == []


async def _is(db: asyncpg.Connection, command: Any, state: str) -> bool:
    return await _state(db, command) == state


async def _watermark_fresh(db: asyncpg.Connection) -> bool:
    return bool(
        await db.fetchval(
            "SELECT reported_at > compute_now() - interval '1 second' FROM consumer_watermarks "
            "WHERE consumer = 'quarantine'"
        )
    )


@pytest.mark.parametrize("setup", sorted(SETUPS))
async def test_a_clone_whose_hello_fact_never_comes_gets_nothing_and_the_node_gets_its_commands(
    keys: Path,
    secured: str,
    logins: dict[str, str],
    database_url: str,
    db: asyncpg.Connection,
    clock: Clock,
    setup: str,
) -> None:
    hold_max = timedelta(seconds=6)
    async with _world(keys, secured, logins, database_url, db, setup, hold_max) as w:
        _withholds(w.attacker)
        await w.honest.hello(_request("b1", "gw-2"), RecordingStream())  # epoch 1
        clone = RecordingStream()
        welcome = await w.attacker.hello(_request("clone-boot", "gw-1"), clone)  # epoch 2
        assert await db.fetchval(
            "SELECT duplicate FROM session_epochs WHERE node_id = 'n1' AND epoch = $1",
            welcome.epoch,
        )
        secret = await enqueue(db, "n1", "exec", {"secret": "s3cr3t"})
        # past the bound and past the time the Hello's fact was due, 3 s at a time, each
        # step seen by the quarantine's watermark (alive, moving) before the next
        for _ in range(5):
            await clock.advance(timedelta(seconds=3))
            await eventually(
                lambda: _watermark_fresh(db), what="the quarantine's watermark, after a step"
            )
        await asyncio.sleep(1.5)  # several looks of the hold bound
        held = await db.fetchval("SELECT held_epoch FROM node_sessions WHERE node_id = 'n1'")
        assert (held, await _state(db, secret), clone.delivered) == (welcome.epoch, "pending", [])
        assert w.runtimes["replay"].metrics.of(replay.HoldMetrics).holds_expired.value() == 0
        # n1's daemon says Hello again at gw-2 (a duplicate: the clone's session is live):
        # counted, with the clone's from its record; its hold ends, the secret goes to n1
        mine = RecordingStream()
        honest = await w.honest.hello(_request("b1", "gw-2"), mine)
        await eventually(lambda: _is(db, secret, "dispatched"), what="the secret sent to n1")
        delivered = await db.fetchval(
            "SELECT session_epoch FROM commands WHERE command_id = $1", secret
        )
        assert delivered == honest.epoch and clone.delivered == []
        counted = await db.fetch(
            "SELECT epoch, gateway_id FROM node_alternations WHERE node_id = 'n1' ORDER BY epoch"
        )
        duplicate = await db.fetchval(
            "SELECT duplicate FROM session_epochs WHERE node_id = 'n1' AND epoch = $1",
            honest.epoch,
        )
        if duplicate:  # the clone's session was still live: both counted
            assert [tuple(r) for r in counted] == [
                (welcome.epoch, "gw-1"),
                (honest.epoch, "gw-2"),
            ]
