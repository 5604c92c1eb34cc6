"""What the security tests share: a login role per database group, member of that group
only, and its URL to the test's database (the `bcw_gateway_bound` login acts as gw-1);
every bus principal's key (`keys`, gateways gw-1 and gw-2, subscriber applications siem
and dashboards, subject root `bc`) and a
nats-server that admits only them (`secured`), one per test module."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from schemas.subjects import Subjects
from tests.conftest import Servers
from workers.embedded.servers import EmbeddedNats
from workers.gateway import store
from workers.registry import ROLES, WORKERS
from workers.runtime.base.runtime_settings import NatsSettings
from workers.runtime.bus import principals, streams
from workers.runtime.store import migrate
from workers.settings import Settings

GROUPS = tuple(ROLES.GROUPS)


def login_of(group: str) -> str:
    """The test login role of a group."""
    return f"{group}_login_t"


def url_as(url: str, user: str) -> str:
    """`url` with another user."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


@pytest.fixture
async def logins(servers: Servers, database_url: str) -> dict[str, str]:
    """A login role per group, member of that group only; its URL to this test's database.
    The `bcw_gateway_bound` login is bound to gateway gw-1."""
    conn = await asyncpg.connect(database_url)
    try:
        # as `bcw migrate --legacy-gateway-role` does on this very database (every group)
        await migrate.grant(conn, ROLES, legacy_gateway=True)
        for group in GROUPS:
            with contextlib.suppress(asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError):
                await conn.execute(f"CREATE ROLE {login_of(group)} LOGIN IN ROLE {group}")
        # the gateway login acts as gw-1 (bcw auth db --bind)
        await store.bind(conn, login_of("bcw_gateway_bound"), "gw-1")
        members = await conn.fetch(
            """
            SELECT r.rolname AS login, g.rolname AS grp FROM pg_auth_members m
              JOIN pg_roles r ON r.oid = m.member JOIN pg_roles g ON g.oid = m.roleid
             WHERE r.rolname = ANY($1)
            """,
            [login_of(g) for g in GROUPS],
        )
    finally:
        await conn.close()
    assert sorted((m["login"], m["grp"]) for m in members) == sorted(
        (login_of(g), g) for g in GROUPS
    )
    return {group: url_as(database_url, login_of(group)) for group in GROUPS}


# -- the bus: every principal's key, and a server that knows them -----------------------

SUBJECTS = Subjects("bc")
#: the subscriber applications with principals of their own (`bcw auth nats --subscribers`)
SUBSCRIBERS = ("siem", "dashboards")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("principals")
    written = principals.write(directory, SUBJECTS, ["gw-1", "gw-2"], SUBSCRIBERS)
    assert {p.name for p in written} == {
        "auth.conf",
        "admin.nk",
        "subscriber.nk",
        "relay.nk",
        "operator.nk",
        "tester.nk",
        "gateway-gw-1.nk",
        "gateway-gw-2.nk",
        *(f"worker-{w}.nk" for w in sorted(WORKERS)),
        *(f"subscriber-{a}.nk" for a in SUBSCRIBERS),
    }
    return directory


@pytest.fixture(scope="module")
def secured(keys: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    conf = keys / "server.conf"
    conf.write_text('include "auth.conf"\n')
    server = EmbeddedNats(tmp_path_factory.mktemp("nats-secured"), extra=["-c", str(conf)]).start()
    yield server.url
    server.stop()


def nats_as(keys: Path, url: str, principal: str) -> NatsSettings:
    """Settings that connect to `url` as `principal`."""
    return NatsSettings(url=url, nkey_seed_file=keys / f"{principal}.nk", connect_timeout=2.0)


@contextlib.asynccontextmanager
async def client_as(keys: Path, url: str, principal: str) -> AsyncIterator[tuple[NATS, list[str]]]:
    """A raw client as `principal` that keeps the server's complaints (permission errors)."""
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    seed = keys / f"{principal}.nk"
    prefix = principals.inbox_prefix(principals.public_key(seed.read_bytes().strip()))
    nc = await nats.connect(
        url, nkeys_seed=str(seed), inbox_prefix=prefix, error_cb=on_error, max_reconnect_attempts=0
    )
    try:
        yield nc, errors
    finally:
        await nc.close()


async def violated(errors: list[str], kind: str) -> bool:
    """Whether the server told a `client_as` client it broke a permission of `kind`
    (`Publish`, `Subscription`)."""
    return any("permissions violation" in e.lower() and kind.lower() in e.lower() for e in errors)


async def got_through(attempts: Mapping[str, Callable[[], Awaitable[Any]]]) -> list[str]:
    """The attempts (by name) that got an answer: a refused one times out or has no
    responder."""
    through = []
    for what, attempt in attempts.items():
        try:
            await attempt()
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            continue
        through.append(what)
    return through


async def answered(nc: NATS, asks: Mapping[str, object], within: float) -> list[str]:
    """The subjects of `asks` (subject → JSON body) a request on which was answered
    within `within` seconds."""

    def ask(subject: str, body: object) -> Callable[[], Awaitable[Any]]:
        return lambda: nc.request(subject, json.dumps(body).encode(), timeout=within)

    return await got_through({subject: ask(subject, body) for subject, body in asks.items()})


@contextlib.asynccontextmanager
async def fresh_streams(
    keys: Path, url: str, layout: Mapping[str, Any] | None = None
) -> AsyncIterator[JetStreamContext]:
    """As `admin`, on the module's shared server: every stream an earlier test left
    deleted, then the streams as `bcw provision` makes them for `layout` (`NatsSettings`
    fields); `admin`'s JetStream, for what the test adds to them."""
    settings = nats_as(keys, url, "admin").model_copy(update=dict(layout or {}))
    async with client_as(keys, url, "admin") as (nc, _):
        js = nc.jetstream()
        for info in await js.streams_info():
            await js.delete_stream(str(info.config.name))
        await streams.provision_streams(js, SUBJECTS, limits=streams.limits_of(settings))
        yield js


async def provision_consumers(
    keys: Path, url: str, settings: Settings, names: Iterable[str] = tuple(WORKERS)
) -> None:
    """The workers' durables of the facts stream as `bcw provision` makes them for
    `settings` (a worker's principal may not make its own: it binds, or waits)."""
    async with client_as(keys, url, "admin") as (nc, _):
        js = nc.jetstream()
        for name in names:
            spec = WORKERS[name](settings).consumer_spec(SUBJECTS)
            await streams.ensure_consumer(js, SUBJECTS.facts_stream, spec, settings.consumer)


async def unproven_hello(
    conn: asyncpg.Connection, gateway: str, lease: int | None, node: str, boot: str
) -> Any:
    """`gateway`'s Hello transaction for `node` (serial `<node>-serial`) from `boot`, run
    by hand as bare SQL (`store.HELLO`), with no proof: what a gateway's login may try."""
    args = ("j", "worker", "1.0.0", 1, "grpc", False, 0, None, "", timedelta(seconds=30))
    proof = (None, None, None)  # none: at, nonce, mac
    return await conn.fetchrow(
        store.HELLO,
        gateway,
        lease,
        node,
        f"{node}-serial",
        boot,
        *args,
        None,
        uuid.uuid4(),
        *proof,
        [],
    )
