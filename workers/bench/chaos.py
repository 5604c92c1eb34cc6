"""`bcw bench chaos --minutes N`: a soak under faults, on embedded servers.

Hellos flow at a steady rate (each node admitted once beforehand, as a gateway's Hello
transaction does, its fact then published and re-published through any outage with the
same `Nats-Msg-Id`) into the five workers, each a `bcw run` process reaching NATS and
PostgreSQL through TCP proxies. Meanwhile, at random: a worker is `kill -9`ed and
restarted, nats-server or PostgreSQL is restarted, the proxies cut every connection or
refuse or blackhole them for a few seconds. At the end the faults stop, the flow is
waited out, and the figures are printed: facts published, effects applied, duplicates,
lost, dead-lettered. The last three must be 0 (exit 1 otherwise).

A Hello's effects are counted where an operator would see them: its `node.connected`
and `node.capabilities-changed` events (exactly one each, per node), its capabilities
row, the inbox rows of the two workers it concerns that keep one (liveness, replay) and
the labels of the third (the labeler keeps no inbox: its effects are idempotent by
construction).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import nats
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from workers.bench.common import hello_fact, print_table, wire
from workers.bench.proxy import Mode, TcpProxy
from workers.embedded import EmbeddedNats, EmbeddedPostgres
from workers.registry import WORKERS
from workers.runtime.bus import deadletter, streams
from workers.runtime.effects import claims
from workers.runtime.store import migrate

GATEWAY = "gw-0"
HELLO_WORKERS = ("labeler", "liveness", "replay")
#: those of them that keep an inbox row per fact; the labeler's labels say it is done
INBOX_WORKERS = ("liveness", "replay")

#: per Hello, once handled: an inbox row of each worker that keeps one, and its node labeled
HANDLED = """
SELECT (SELECT count(*) FROM processed_facts WHERE consumer = ANY($1::text[]))
     + (SELECT count(DISTINCT node_id) FROM node_labels WHERE source = 'system')
"""


@dataclass
class Chaos:
    """The soak's moving parts and what it did to them."""

    base: Path
    nats: EmbeddedNats
    postgres: EmbeddedPostgres
    nats_proxy: TcpProxy
    postgres_proxy: TcpProxy
    database: str
    subjects: Subjects
    rng: random.Random
    processes: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)

    @property
    def database_url(self) -> str:
        return self.postgres.url_for(self.database)

    def worker_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "BCW_DATABASE_URL": self.postgres_proxy.url(
                "postgresql", f"/{self.database}", "postgres"
            ),
            "BCW_NATS_URL": self.nats_proxy.url("nats"),
            "BCW_SUBJECT_ROOT": self.subjects.root,
            "BCW_HEALTH_PORT": "0",
            "BCW_LOG_LEVEL": "WARNING",
            "BCW_CONSUMER_ACK_WAIT": "10",
            "BCW_DATABASE_COMMAND_TIMEOUT": "8",
            "BCW_DATABASE_CONNECT_TIMEOUT": "3",
            "BCW_NATS_CONNECT_TIMEOUT": "3",
            # no daemon flushes liveness in this soak: no session may age out meanwhile
            "BCW_LIVENESS_HEARTBEAT_INTERVAL": "3600",
        }

    async def start_worker(self, name: str) -> None:
        log = (self.base / f"{name}.log").open("ab")
        with log:
            self.processes[name] = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "workers.cli",
                "run",
                name,
                env=self.worker_env(),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )

    # -- the faults ------------------------------------------------------------------
    async def kill_a_worker(self) -> None:
        name = self.rng.choice(sorted(self.processes))
        self.processes[name].kill()
        await self.processes[name].wait()
        await asyncio.sleep(self.rng.uniform(0.5, 3))
        await self.start_worker(name)
        self.faults[f"kill -9 {name}"] += 1

    async def restart_nats(self) -> None:
        await asyncio.to_thread(self.nats.stop)
        await asyncio.sleep(self.rng.uniform(1, 5))
        await asyncio.to_thread(self.nats.start)
        self.faults["restart nats-server"] += 1

    async def restart_postgres(self) -> None:
        await asyncio.to_thread(self.postgres.stop)
        await asyncio.sleep(self.rng.uniform(1, 5))
        await asyncio.to_thread(self.postgres.start)
        self.faults["restart postgres"] += 1

    async def cut(self) -> None:
        proxy, what = self.rng.choice(
            [(self.nats_proxy, "nats"), (self.postgres_proxy, "postgres")]
        )
        mode = self.rng.choice([None, Mode.REFUSE, Mode.BLACKHOLE])
        if mode is None:
            proxy.cut()
            self.faults[f"cut {what} connections"] += 1
        else:
            await proxy.outage(self.rng.uniform(2, 10), mode)
            self.faults[f"{mode.value} {what}"] += 1

    async def rampage(self, until: float) -> None:
        faults: list[Callable[[], Awaitable[None]]] = [
            self.kill_a_worker,
            self.kill_a_worker,
            self.restart_nats,
            self.restart_postgres,
            self.cut,
            self.cut,
        ]
        while time.monotonic() < until:
            await asyncio.sleep(min(self.rng.uniform(8, 20), max(0.0, until - time.monotonic())))
            if time.monotonic() < until:
                await self.rng.choice(faults)()


async def run(minutes: float, rate: float, seed: int) -> int:
    base = Path(tempfile.mkdtemp(prefix="bcw-chaos-"))
    nats_server = EmbeddedNats(base / "nats")
    postgres = EmbeddedPostgres(base / "postgres")
    try:
        nats_server.start()
        postgres.start()
        return await _soak(base, nats_server, postgres, minutes, rate, seed)
    finally:
        postgres.stop()
        nats_server.stop()
        shutil.rmtree(base, ignore_errors=True)


async def _soak(
    base: Path,
    nats_server: EmbeddedNats,
    postgres: EmbeddedPostgres,
    minutes: float,
    rate: float,
    seed: int,
) -> int:
    nodes = [f"chaos-{i:06d}" for i in range(max(1, int(minutes * 60 * rate)))]
    database = f"bcw_chaos_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(postgres.url)
    await admin.execute(f'CREATE DATABASE "{database}"')
    await admin.close()
    chaos = Chaos(
        base,
        nats_server,
        postgres,
        await TcpProxy("127.0.0.1", nats_server.port).start(),
        await TcpProxy("127.0.0.1", postgres.port).start(),
        database,
        Subjects(f"chaos{uuid.uuid4().hex[:6]}"),
        random.Random(seed),
    )
    await _prepare(chaos, nodes)
    for name in sorted(WORKERS):
        await chaos.start_worker(name)
    nc = await nats.connect(
        nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.5, error_cb=_quiet
    )
    started = time.monotonic()
    print(f"chaos: {len(nodes)} Hellos at {rate:g}/s for {minutes:g} min, faults every 8-20 s")
    try:
        publishing = asyncio.create_task(publish_hellos(nc, chaos.subjects, nodes, rate))
        await chaos.rampage(started + minutes * 60)
        await publishing
        print(f"chaos: faults over after {time.monotonic() - started:.0f} s; waiting for the flow")
        settled = await wait_settled(chaos.database_url, len(nodes), within=300)
        figures = await count_effects(chaos.database_url, chaos.subjects, nc, nodes)
    finally:
        for process in chaos.processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        await asyncio.gather(*(p.wait() for p in chaos.processes.values()))
        await nc.close()
        await chaos.nats_proxy.stop()
        await chaos.postgres_proxy.stop()
    print_table(
        "faults injected",
        ("fault", "times"),
        [(fault, str(n)) for fault, n in sorted(chaos.faults.items())],
    )
    print_table("chaos: results", ("figure", "value"), [(k, str(v)) for k, v in figures.items()])
    print(f"settled {settled:.0f} s after the last fact" if settled >= 0 else "did NOT settle")
    bad = figures["duplicates"] or figures["lost"] or figures["dead-lettered"] or settled < 0
    print("FAIL" if bad else "ok: every effect once, nothing lost, nothing dead-lettered")
    return 1 if bad else 0


async def _quiet(_error: Exception) -> None:
    """The publisher's reconnects while nats-server restarts are the point, not news."""


async def _prepare(chaos: Chaos, nodes: list[str]) -> None:
    conn = await asyncpg.connect(chaos.database_url)
    try:
        await migrate.migrate(conn)
    finally:
        await conn.close()
    await join_fleet(chaos.database_url, nodes)
    nc = await nats.connect(chaos.nats.url)
    try:
        await streams.provision_streams(nc.jetstream(), chaos.subjects)
    finally:
        await nc.close()


async def join_fleet(database_url: str, nodes: list[str]) -> None:
    """`nodes` joined, each with a session at epoch 1 on `GATEWAY` (as its Hello transaction
    leaves it), and the gateway's lease for a day."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO gateways (gateway_id, lease_epoch, lease_expires_at) "
            "VALUES ($1, 1, compute_now() + interval '1 day')",
            GATEWAY,
        )
        await conn.execute(
            "SELECT join_node(n, 'worker', n || '-serial', NULL) FROM unnest($1::text[]) AS n",
            nodes,
        )
        await conn.execute(
            """
            UPDATE node_sessions SET session_epoch = 1, gateway_id = $1, boot_id = 'boot-1',
                   journal_id = 'journal-1', connected_at = compute_now(), last_seen = compute_now()
            """,
            GATEWAY,
        )
    finally:
        await conn.close()


def capabilities(node: str) -> list[str]:
    return sorted({"gpu", f"rack-{int(node.rsplit('-', 1)[1]) % 7}"})


async def publish_hellos(
    nc: NATS,
    subjects: Subjects,
    nodes: list[str],
    rate: float,
    shape: Callable[[bytes], bytes] | None = None,
) -> None:
    """A Hello per node at `rate` per second, each through any outage with the same
    `Nats-Msg-Id`; `shape` rewrites each body (as another release's gateway sends it)."""
    js = nc.jetstream()
    started = time.monotonic()
    for i, node in enumerate(nodes):
        fact = hello_fact(node, gateway_id=GATEWAY, capabilities=capabilities(node))
        subject, body, headers = wire(subjects, fact)
        body = shape(body) if shape is not None else body
        while True:  # through a restart: the same Nats-Msg-Id, so JetStream keeps one
            try:
                await js.publish(subject, body, headers=headers, timeout=2)
                break
            except Exception:
                await asyncio.sleep(0.2)
        await asyncio.sleep(max(0.0, started + (i + 1) / rate - time.monotonic()))


async def hellos_handled(database_url: str) -> int:
    """3 per Hello once its three workers handled it (`HANDLED`; 0 while the database
    cannot be reached)."""
    with contextlib.suppress(Exception):
        conn = await asyncpg.connect(database_url, timeout=3)
        try:
            return int(await conn.fetchval(HANDLED, list(INBOX_WORKERS)))
        finally:
            await conn.close()
    return 0


async def wait_settled(database_url: str, hellos: int, within: float) -> float:
    """Seconds until every Hello was handled by its three workers and the outbox is empty
    (-1 when not within `within`)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        if await hellos_handled(database_url) == hellos * len(HELLO_WORKERS):
            with contextlib.suppress(Exception):
                conn = await asyncpg.connect(database_url, timeout=3)
                try:
                    if (await claims.waiting(conn, None))[0] == 0:
                        return time.monotonic() - started
                finally:
                    await conn.close()
        await asyncio.sleep(1)
    return -1.0


async def count_effects(
    database_url: str, subjects: Subjects, nc: NATS, nodes: list[str]
) -> dict[str, int]:
    """Facts published, effects applied (each node's two events and its capabilities row),
    duplicates, lost, dead-lettered, the inbox rows of the Hello workers that keep one and
    the nodes labeled."""
    conn = await asyncpg.connect(database_url)
    try:
        stored = {
            r["node_id"]: list(r["capabilities"] or [])
            for r in await conn.fetch("SELECT node_id, capabilities FROM node_sessions")
        }
        inbox = Counter(
            dict(await conn.fetch("SELECT consumer, count(*) FROM processed_facts GROUP BY 1"))
        )
        labeled = await conn.fetchval(
            "SELECT count(DISTINCT node_id) FROM node_labels WHERE source = 'system'"
        )
    finally:
        await conn.close()
    events = await _events(nc, subjects)
    connected = events.get("node.connected", Counter())
    changed = events.get("node.capabilities-changed", Counter())
    applied = sum(
        1
        for node in nodes
        if connected[node] and changed[node] and stored.get(node) == capabilities(node)
    )
    duplicates = sum(n - 1 for n in connected.values() if n > 1)
    duplicates += sum(n - 1 for n in changed.values() if n > 1)
    dead = await _count_dead(nc, subjects)
    return {
        "facts published": len(nodes),
        "effects applied": applied,
        "duplicates": duplicates,
        "lost": len(nodes) - applied,
        "dead-lettered": dead,
        **{f"inbox rows ({worker})": inbox[worker] for worker in INBOX_WORKERS},
        "nodes labeled": int(labeled),
    }


async def _events(nc: NATS, subjects: Subjects, within: float = 120) -> dict[str, Counter[str]]:
    """Every event on the events stream, counted per type and node: read until the
    consumer has none pending (a fetch that times out on a loaded machine is tried again,
    never taken for the end of the stream)."""
    js = nc.jetstream()
    sub = await js.pull_subscribe(subjects.all_events, stream=subjects.events_stream)
    total = (await sub.consumer_info()).num_pending or 0  # the events there are, to the last
    out: dict[str, Counter[str]] = {}
    seen, deadline = 0, time.monotonic() + within
    try:
        while seen < total and time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(500, timeout=2)
            except TimeoutError:  # nats-py raises nats' own or asyncio's: both are this
                continue
            for msg in msgs:
                seen += 1
                body = json.loads(msg.data)
                bc_type = (msg.headers or {}).get("Bc-Type", "")
                out.setdefault(bc_type, Counter())[body.get("nodeId", "")] += 1
                await msg.ack()
    finally:
        await sub.unsubscribe()
    return out


async def _count_dead(nc: NATS, subjects: Subjects) -> int:
    """Letters in every dead stream (each publisher's, and an old one's)."""
    js, held = nc.jetstream(), 0
    for stream in await deadletter.dead_streams(js, subjects):
        try:
            held += int((await js.stream_info(stream)).state.messages)
        except nats.js.errors.NotFoundError:
            continue
    return held
