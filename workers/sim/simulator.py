"""The fleet simulator (`bcw sim`, and a library for tests and the demo).

N fake daemons over M reference gateways in one process, against given NATS and
PostgreSQL; the workers run elsewhere (or in the same event loop). On a database of its
own (`owns_clock`), simulated time runs `speed` times faster than the wall clock through
`compute_now()`'s offset, so scenarios that need minutes (a gateway's 120 s grace,
back-offs, the quarantine window) take seconds; on any other it runs in real time, with
its waits stretched to match, and never touches the clock. Each scenario returns checks
of the database and of the events about its own nodes and gateways (its `prefix`), so
runs against one system each report what they did.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from schemas.subjects import Subjects
from workers.gateway import Gateway, GatewaySettings, notices
from workers.runtime.bus import deadletter
from workers.sim.clock import SimClock
from workers.sim.daemon import FakeDaemon
from workers.sim.profiles import pick

log = logging.getLogger(__name__)

#: The share of simulated daemons that run a skew profile (an older bcd, a node without
#: a GPU) instead of bcd's: their capabilities and versions differ from the rest.
SKEW_SHARE = 0.25

#: An operator label on every node a simulator joined (its value: the run's prefix). Only
#: a database whose sessions all carry it may have its clock moved by `bcw sim`.
SIMULATED_LABEL = "bc.dev/simulated"

_FOREIGN_SESSIONS = """
SELECT count(*) AS n, min(s.node_id) AS example FROM node_sessions s
WHERE NOT EXISTS (SELECT 1 FROM node_labels l
                  WHERE l.node_id = s.node_id AND l.source = 'operator' AND l.key = $1)
"""


async def foreign_sessions(conn: asyncpg.Connection) -> tuple[int, str | None]:
    """How many sessions no simulator created (and one of them): the sessions that moving
    `compute_now()` would age."""
    row = await conn.fetchrow(_FOREIGN_SESSIONS, SIMULATED_LABEL)
    return int(row["n"]), row["example"]


#: The most simulated time one step of `Simulator.run` adds beyond the wall clock's. A
#: gateway renews its 15 s lease every 5 s, at most once a step: a step that leapt a
#: lease's length would end every gateway at once, which no real fleet does.
MAX_LEAP = 3.0
#: wall seconds between the gateways' ticks while one step's daemons are still busy
GATEWAY_TICK = 1.0


def leap(step: float, speed: float) -> float:
    """The simulated seconds to add after a step of `step` wall seconds at `speed` (the
    wall clock adds its own `step`): `(speed - 1) * step`, but never over `MAX_LEAP`, so
    that on a loaded machine, where a step is slow, simulated time runs slower instead of
    jumping past the gateways' lease renewals. Pure."""
    return min(max(0.0, (speed - 1.0) * step), MAX_LEAP)


def about(body: Mapping[str, object], prefix: str) -> bool:
    """Whether an event (or a dead-lettered message) is about one of a run's nodes or
    gateways: node ids are `<prefix>-<i>`, gateway ids `<prefix>-gw-<g>`. Pure."""
    own = prefix + "-"
    return any(
        isinstance(value, str) and value.startswith(own)
        for value in (
            body.get("nodeId"),
            body.get("gatewayId"),
            body.get("node_id"),
            body.get("gateway_id"),
        )
    )


@dataclass(frozen=True)
class Check:
    name: str
    expected: str
    actual: str
    ok: bool


class Simulator:
    def __init__(
        self,
        pool: asyncpg.Pool,
        nc: NATS,
        subjects: Subjects,
        *,
        nodes: int,
        gateways: int,
        seed: int = 1,
        prefix: str = "sim",
        gateway_settings: GatewaySettings | None = None,
        owns_clock: bool = True,
    ) -> None:
        self.pool = pool
        self.nc = nc
        self.subjects = subjects
        self.n_nodes = nodes
        self.n_gateways = gateways
        self.prefix = prefix
        self.owns_clock = owns_clock
        self.started_at = datetime.now(UTC)
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.gateway_settings = gateway_settings or GatewaySettings()
        self.gateways: list[Gateway] = []
        self.daemons: list[FakeDaemon] = []
        self.progress: Callable[[str], None] = lambda _text: None

    # -- life ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.started_at = datetime.now(UTC)
        async with self.pool.acquire() as conn:
            if self.owns_clock:
                await self.clock.reset(conn)
            await conn.execute(
                "SELECT join_node($1 || '-' || i, 'worker', $1 || '-serial-' || i, NULL) FROM generate_series(1, $2) i",
                self.prefix,
                self.n_nodes,
            )
            await conn.execute(
                "INSERT INTO node_labels (node_id, key, value, source) "
                "SELECT $1 || '-' || i, $3, $1, 'operator' FROM generate_series(1, $2) i "
                "ON CONFLICT DO NOTHING",
                self.prefix,
                self.n_nodes,
                SIMULATED_LABEL,
            )
        for g in range(self.n_gateways):
            self.gateways.append(await self._started_gateway(f"{self.prefix}-gw-{g}"))
        keys = [self.rng.randbytes(32) for _ in range(self.n_nodes)]
        signing = await self._enrolled(keys)
        for i in range(1, self.n_nodes + 1):
            profile = pick(self.rng, SKEW_SHARE)
            self.daemons.append(
                FakeDaemon(
                    f"{self.prefix}-{i}",
                    f"{self.prefix}-serial-{i}",
                    self.clock,
                    self.rng,
                    list(profile.capabilities),
                    profile.version,
                    home=i % self.n_gateways,
                    hello_key=keys[i - 1] if signing else None,
                )
            )

    async def _enrolled(self, keys: list[bytes]) -> bool:
        """Give each simulated node its Hello key, as a join would; whether it could (only
        the schema's owner may: else its daemons do not sign)."""
        try:
            async with self.pool.acquire() as conn:
                await conn.execute(
                    "SELECT enroll_hello_key($1 || '-' || i, k) "
                    "FROM unnest($2::bytea[]) WITH ORDINALITY AS t(k, i)",
                    self.prefix,
                    keys,
                )
            return True
        except asyncpg.InsufficientPrivilegeError:
            log.warning("sim: this login may not enroll Hello keys: its daemons do not sign")
            return False

    async def _started_gateway(self, gateway_id: str) -> Gateway:
        # its notices consumer, as `bcw provision` makes it (the gateway makes none)
        await notices.provision(self.nc.jetstream(timeout=5.0), self.subjects, gateway_id)
        gateway = Gateway(
            gateway_id,
            self.pool,
            self.nc,
            self.subjects,
            self.clock,
            self.clock,
            self.gateway_settings,
        )
        await gateway.start(autotick=None)  # the simulator ticks it, moving time
        return gateway

    async def revive(self, gateway: Gateway) -> Gateway:
        """A new incarnation of a stopped gateway, in its place (a rack back after a loss)."""
        again = await self._started_gateway(gateway.gateway_id)
        self.gateways[self.gateways.index(gateway)] = again
        return again

    async def stop(self, graceful: bool = False) -> None:
        for gateway in self.gateways:
            if gateway.alive:
                await gateway.stop(graceful=graceful)
        if self.owns_clock:
            async with self.pool.acquire() as conn:
                await self.clock.reset(conn)

    # -- time ------------------------------------------------------------------------------
    async def tick(self) -> None:
        """One step: the gateways' due work (lease, flush, silent sessions), then every
        daemon with something due. While the daemons' part lasts longer than
        `GATEWAY_TICK` (a power-on herd on a loaded machine), the gateways tick again
        beside it, as a real gateway's own loop would: a slow step renews their leases."""
        await self._tick_gateways()
        limit = asyncio.Semaphore(512)  # a herd: many daemons at once

        async def one(daemon: FakeDaemon) -> None:
            async with limit:
                await daemon.tick(self.gateways)

        daemons = asyncio.ensure_future(
            asyncio.gather(*(one(d) for d in self.daemons if not d.idle(d.now())))
        )
        try:
            while not (await asyncio.wait({daemons}, timeout=GATEWAY_TICK))[0]:
                await self._tick_gateways()
        finally:
            daemons.cancel()  # done by now, unless a gateway's tick failed
        await daemons

    async def _tick_gateways(self) -> None:
        for gateway in self.gateways:
            await gateway.tick()

    async def run(
        self,
        until: Callable[[], Awaitable[bool]],
        *,
        within: float = 60.0,
        speed: float = 5.0,
        what: str = "",
        interval: float = 0.1,
    ) -> bool:
        """Tick until `until()` holds (checked every wall second) or `within * speed`
        simulated seconds pass, simulated time running up to `speed` times faster than
        the wall clock (`leap`). The budget is simulated time, so on a loaded machine a
        scenario takes longer rather than failing; `within * speed` wall seconds bound it
        all the same. In real time (not `owns_clock`) the clock is never moved and the
        same span takes `within * speed` wall seconds."""
        span = within * speed
        if not self.owns_clock:
            speed = 1.0
        began, deadline = self.clock(), time.monotonic() + span
        checked = 0.0
        async with self.pool.acquire() as conn:
            while self.clock() - began < span and time.monotonic() < deadline:
                started = time.monotonic()
                await self.tick()
                if started - checked >= 1.0:
                    checked = started
                    if await until():
                        return True
                    if what:
                        self.progress(what)
                elapsed = time.monotonic() - started
                pause = max(0.0, interval - elapsed)
                await asyncio.sleep(pause)
                if speed != 1.0:
                    await self.clock.advance(conn, leap(pause + elapsed, speed))
        return await until()

    # -- looking ---------------------------------------------------------------------------
    async def fetchval(self, sql: str, *args: object) -> object:
        async with self.pool.acquire() as conn:
            return await conn.fetchval(sql, *args)

    async def connected(self) -> int:
        value = await self.fetchval(
            "SELECT count(*) FROM node_sessions WHERE node_id LIKE $1 AND gateway_id IS NOT NULL",
            self.prefix + "-%",
        )
        return int(value)  # type: ignore[call-overload]

    async def enqueue(
        self,
        daemons: Sequence[FakeDaemon],
        per_node: int,
        kind: str = "exec",
        lane: str = "default",
    ) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute(
                "SELECT enqueue_command(n, $2, '{}', $3) FROM unnest($1::text[]) n, generate_series(1, $4)",
                [d.node_id for d in daemons],
                kind,
                lane,
                per_node,
            )

    async def events(self) -> Counter[tuple[str, str]]:
        """(type, reason) of every event about this run's nodes and gateways published
        since it started."""
        js = self.nc.jetstream()
        counts: Counter[tuple[str, str]] = Counter()
        sub = await js.pull_subscribe(
            self.subjects.all_events,
            durable=None,
            stream=self.subjects.events_stream,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_TIME,
                opt_start_time=self.started_at,
                ack_policy=AckPolicy.NONE,
                inactive_threshold=30,
            ),
        )
        try:
            total = (await sub.consumer_info()).num_pending or 0
            seen = 0
            while seen < total:
                try:
                    msgs = await sub.fetch(min(1000, total - seen), timeout=2)
                except TimeoutError:
                    break
                for msg in msgs:
                    body = json.loads(msg.data)
                    if about(body, self.prefix):
                        kind = msg.headers.get("Bc-Type", "?") if msg.headers else "?"
                        counts[(kind, body.get("reason") or "")] += 1
                seen += len(msgs)
        finally:
            await sub.unsubscribe()
        return counts

    async def dead_letters(self) -> int:
        """Dead letters about this run's nodes and gateways (since it started)."""
        letters = await deadletter.list_dead_letters(self.nc.jetstream(), self.subjects)
        count = 0
        for letter in letters:
            if letter.time is not None and letter.time < self.started_at:
                continue
            try:
                body = json.loads(letter.data)
            except ValueError:
                body = {}
            on_subject = f".{self.prefix}-gw-" in letter.subject
            if on_subject or (isinstance(body, dict) and about(body, self.prefix)):
                count += 1
        return count
