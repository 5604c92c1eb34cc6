"""The production layout, started as docs/kubernetes.md tells an operator (issue #59, What to
build 6), then finding 5's attacks on it.

The layout: the bus's logins from `bcw auth nats` (a nats-server that includes its
`auth.conf` and admits nobody else), the schema and its policy from `bcw migrate` at
`require`, a login per worker and per relay in its group and a gateway's login bound by
`bcw auth db --bind`, the streams (each gateway's own facts stream: `BCW_NATS_FACTS_GATEWAYS`)
and consumers from `bcw provision` as `admin`, the five workers each `bcw run <worker>` as
its own principal and login with its relay off (`BCW_OUTBOX_RELAY=false`), and a dedicated
relay, `bcw run relay`, as the `relay` principal. A gateway (gw-1, its own nkey and bound
login) and a node's daemon (its Hellos proven by its key) on top.

Finding 6: there the dedicated relay never started — it read every stream's info at start,
`BC_FACTS_gw-1`'s too, which its principal may not — so nothing was published: no event,
no dispatch, no revocation. Here each goes out: `node.connected`, a command that reaches the
daemon, and a revocation of the node's certificate once a clone with its key alternates
with it.

Finding 5, against the same relay: the labeler's login writes a pack whose `Bc-Type` is a
list (it raised TypeError out of every round: no dispatch for 40 s) and one with a
`Nats-Rollup: all` header (answered 500 and retried for ever: every dispatch slowed from 1 to
3 s). Each is buried alone with its reason; the relay keeps running, and a command enqueued
beside them reaches the daemon within the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas import REGISTRY
from schemas.events import CapabilitiesChanged
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.security.conftest import url_as
from tests.integration.support import bcw, eventually, stream_messages
from workers.embedded.servers import EmbeddedNats, die_with_parent
from workers.gateway import Gateway
from workers.registry import WORKERS
from workers.replay.commands import enqueue_command as enqueue
from workers.runtime.base.runtime_settings import NatsSettings
from workers.runtime.bus import connection
from workers.sim.daemon import FakeDaemon

pytestmark = pytest.mark.slow

SUBJECTS = Subjects("bc")  # the docs' root, on a nats-server of this test's own
GATEWAY = "gw-1"
#: what a command may take from its enqueueing to the daemon, on a shared 2-core machine
#: (the relay's round, the replay worker's dispatch loop, the gateway's pull)
DISPATCH_BOUND = 15.0
#: the logins of this test (cluster-wide names: one per group, shared by the test's runs)
LOGIN = "p59_{}_login"


@contextlib.asynccontextmanager
async def _nats(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """Step 2 and 3 of the docs: `bcw auth nats`, and a server that includes its `auth.conf`."""
    keys = tmp_path / "auth"
    code, output = await bcw("auth", "nats", "--gateways", GATEWAY, "--out", str(keys))
    assert code == 0, output
    conf = keys / "server.conf"
    conf.write_text('include "auth.conf"\n')
    server = EmbeddedNats(tmp_path / "nats", extra=["-c", str(conf)]).start()
    try:
        yield server.url, keys
    finally:
        server.stop()


async def _database(database_url: str, db: asyncpg.Connection) -> dict[str, str]:
    """Steps 5 and 6: `bcw migrate` at `require`, a login per worker and relay in its
    group, the gateway's login bound by `bcw auth db --bind`; each login's URL."""
    code, output = await bcw("migrate", BCW_DATABASE_URL=database_url, BCW_HELLO_PROOF="require")
    assert code == 0 and "Hello proofs: require" in output, output
    urls = {}
    for name in [*WORKERS, "relay"]:
        login = LOGIN.format(name)
        with contextlib.suppress(asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError):
            await db.execute(f"CREATE ROLE {login} LOGIN IN ROLE bcw_{name}")
        urls[name] = url_as(database_url, login)
    gateway = LOGIN.format("gw1")
    with contextlib.suppress(asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError):
        await db.execute(f"CREATE ROLE {gateway} LOGIN IN ROLE bcw_gateway_bound")
    code, output = await bcw(
        "auth", "db", "--bind", f"{gateway}={GATEWAY}", BCW_DATABASE_URL=database_url
    )
    assert code == 0 and f"acts as {GATEWAY}" in output, output
    urls[GATEWAY] = url_as(database_url, gateway)
    return urls


@contextlib.asynccontextmanager
async def _processes(
    url: str, keys: Path, urls: dict[str, str], logs: Path
) -> AsyncIterator[dict[str, asyncio.subprocess.Process]]:
    """Step 8, as the chart runs it: each worker and the relay a process of its own, with
    its own nkey and login; the workers' relays off. Stopped with SIGTERM."""
    common = {
        "BCW_NATS_URL": url,
        "BCW_SUBJECT_ROOT": SUBJECTS.root,
        "BCW_NATS_FACTS_GATEWAYS": GATEWAY,
        "BCW_HEALTH_PORT": "0",
        "BCW_DATABASE_POOL_MAX": "3",
        "BCW_LOG_FORMAT": "console",
        # one alternation more than none quarantines: the clone below is revoked quickly
        "BCW_QUARANTINE_MAX_ALTERNATIONS": "1",
    }
    procs: dict[str, asyncio.subprocess.Process] = {}
    try:
        for name in [*WORKERS, "relay"]:
            principal = "relay" if name == "relay" else f"worker-{name}"
            env = {
                **common,
                "BCW_NATS_NKEY_SEED_FILE": str(keys / f"{principal}.nk"),
                "BCW_DATABASE_URL": urls[name],
                **({} if name == "relay" else {"BCW_OUTBOX_RELAY": "false"}),
            }
            with (logs / f"{name}.log").open("w") as out:
                procs[name] = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "workers.cli",
                    "run",
                    name,
                    env={**_environ(), **env},
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    preexec_fn=die_with_parent(signal.SIGTERM),
                )
        yield procs
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _environ() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("BCW_")}


@contextlib.asynccontextmanager
async def _gateway(url: str, keys: Path, database_url: str) -> AsyncIterator[Gateway]:
    """The gateway gw-1: its own nkey, its bound login."""
    nc = await connection.connect(
        NatsSettings(url=url, nkey_seed_file=keys / f"gateway-{GATEWAY}.nk"), name=GATEWAY
    )
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    gateway = Gateway(GATEWAY, pool, nc, SUBJECTS)
    try:
        await gateway.start()
        yield gateway
    finally:
        await gateway.stop(graceful=False)
        await pool.close()
        await nc.close()


@contextlib.asynccontextmanager
async def _ticking(daemons: list[FakeDaemon], gateway: Gateway) -> AsyncIterator[None]:
    """The node's daemons (and a clone, once added to `daemons`), ticking every 0.1 s."""

    async def tick() -> None:
        while True:
            for daemon in list(daemons):
                await daemon.tick([gateway])
            await asyncio.sleep(0.1)

    task = asyncio.create_task(tick())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _admin(url: str, keys: Path) -> NATS:
    return await connection.connect(
        NatsSettings(url=url, nkey_seed_file=keys / "admin.nk"), name="a"
    )


def _pack_sql() -> str:
    return (
        "INSERT INTO outbox_packs (worker, size, msg_ids, subjects, headers, bodies, order_keys)"
        " VALUES ('labeler', $1, $2, $3, $4, $5, $6)"
    )


async def _plant(labeler: asyncpg.Connection, *messages: tuple[str, str, bytes]) -> None:
    await labeler.execute(
        _pack_sql(),
        len(messages),
        [uuid.uuid4() for _ in messages],
        [m[0] for m in messages],
        [m[1] for m in messages],
        [m[2] for m in messages],
        ["n1" for _ in messages],
    )


def _failed(logs: Path, procs: dict[str, asyncio.subprocess.Process]) -> str:
    """What the processes said (for an assertion's message)."""
    return "\n".join(
        f"--- {name} (exit {proc.returncode}):\n{(logs / f'{name}.log').read_text()[-3000:]}"
        for name, proc in procs.items()
    )


async def test_the_production_layout_publishes_and_survives_a_workers_bad_rows(
    servers: Servers, database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    async with _nats(tmp_path) as (url, keys):
        urls = await _database(database_url, db)
        code, output = await bcw(
            "provision",
            BCW_NATS_URL=url,
            BCW_NATS_NKEY_SEED_FILE=str(keys / "admin.nk"),
            BCW_NATS_FACTS_GATEWAYS=GATEWAY,
            BCW_DATABASE_URL=database_url,
        )
        assert code == 0 and f"{SUBJECTS.facts_stream}_{GATEWAY}" in output, output
        await fleet.join(db, "n1")  # its Hello key enrolled: its daemon proves
        admin = await _admin(url, keys)
        js = admin.jetstream()
        daemon = FakeDaemon(
            "n1", "n1-serial", time.time, random.Random(1), hello_key=fleet.hello_key("n1")
        )
        daemons = [daemon]
        async with (
            _processes(url, keys, urls, logs) as procs,
            _gateway(url, keys, urls[GATEWAY]) as gateway,
            _ticking(daemons, gateway),
        ):

            async def on_bus(subject: str) -> bool:
                if any(p.returncode is not None for p in procs.values()):
                    raise AssertionError(_failed(logs, procs))
                messages = await stream_messages(js, SUBJECTS.events_stream, subject)
                return bool(messages)

            # an event: the node's session opened (proven), relayed by the dedicated relay
            try:
                await eventually(
                    lambda: on_bus(SUBJECTS.event("node.connected")),
                    within=90,
                    what="node.connected published by the dedicated relay",
                )
            except AssertionError as missing:
                raise AssertionError(f"{missing}\n{_failed(logs, procs)}") from None
            assert daemon.connected
            # a dispatch: a command that reaches the daemon
            first = await enqueue(db, "n1", "noop", {})
            await eventually(lambda: _ran(daemon, first), within=60, what="the first command run")

            # finding 5: the labeler's login plants what stopped (or slowed) the relay
            body, headers = REGISTRY.encode(
                CapabilitiesChanged(node_id="n1", epoch=1, added=["x"], removed=[])
            )
            subject = SUBJECTS.event("node.capabilities-changed")
            listed = json.dumps({**headers, "Bc-Type": ["node.capabilities-changed"]})
            rollup = json.dumps({**headers, "Nats-Rollup": "all"})
            labeler = await asyncpg.connect(urls["labeler"])
            try:
                await _plant(labeler, (subject, listed, body))
                await _plant(labeler, (subject, rollup, body))
            finally:
                await labeler.close()
            events_before = len(await stream_messages(js, SUBJECTS.events_stream))
            started = time.monotonic()
            second = await enqueue(db, "n1", "noop", {})
            await eventually(
                lambda: _ran(daemon, second),
                within=DISPATCH_BOUND,
                what="a command enqueued beside the bad rows run within the bound",
            )
            took = time.monotonic() - started

            async def buried() -> bool:
                return await db.fetchval("SELECT count(*) FROM outbox_dead") == 2

            await eventually(buried, within=10, what="both bad rows buried")
            reasons = sorted(r["reason"] for r in await db.fetch("SELECT reason FROM outbox_dead"))
            assert reasons == [
                "header 'Nats-Rollup' is not one a worker sends",
                "header Bc-Type is not a string (list)",
            ]
            assert (
                await db.fetchval(
                    "SELECT count(*) FROM outbox_packs WHERE worker = 'labeler'"
                    " AND created_at < now() - interval '5 seconds'"
                )
                == 0
            )
            # nothing purged (the rollup never reached the server), nothing of them published
            events = await stream_messages(js, SUBJECTS.events_stream)
            assert len(events) >= events_before
            assert not [m for m in events if m.subject == subject and m.data == body]

            # a revocation: a clone with the node's key (another boot) alternates with it
            daemons.append(daemon.clone(home=0))

            async def revoked() -> bool:
                return await on_bus(SUBJECTS.revocations)

            await eventually(revoked, within=90, what="the clone's certificate revoked on the bus")
            [notice] = await stream_messages(js, SUBJECTS.events_stream, SUBJECTS.revocations)
            assert json.loads(notice.data)["serials"] == ["n1-serial"]
            assert all(p.returncode is None for p in procs.values()), _failed(logs, procs)
        await admin.close()
    assert took < DISPATCH_BOUND
    relay_log = (logs / "relay.log").read_text()
    assert "Traceback" not in relay_log and "TypeError" not in relay_log, relay_log[-3000:]
    assert "still waiting" not in relay_log


async def _ran(daemon: FakeDaemon, command: uuid.UUID) -> bool:
    return daemon.runs[command] >= 1 or command in daemon.results
