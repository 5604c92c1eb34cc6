"""Reference gateways whose sessions heartbeat, as daemons would: for tests of what the
liveness controller makes of real flushes (`sight/test_blindness.py`,
`faults/test_overload.py`). Periods are short: heartbeat 1 s, three missed, flush 1 s."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.support import eventually
from workers.gateway import Gateway, GatewaySettings, HelloRequest, Refused
from workers.liveness.settings import LivenessSettings
from workers.runtime.base.runtime_settings import NatsSettings
from workers.settings import Settings

GATEWAY_SETTINGS = GatewaySettings(
    heartbeat_interval=1.0, missed_heartbeats=3, flush_period=1.0, lease_ttl=3.0, renew_every=0.5
)


def liveness_settings(base: Settings, nats_url: str | None = None) -> Settings:
    """The liveness worker's rules for these gateways' periods (and its NATS, if given)."""
    second = timedelta(seconds=1)
    update: dict[str, Any] = {
        "liveness": LivenessSettings(
            sweep_interval=0.5,
            heartbeat_interval=1 * second,
            missed_heartbeats=3,
            flush_period=1 * second,
            gateway_grace=3 * second,
        )
    }
    if nats_url:
        update["nats"] = NatsSettings(url=nats_url, connect_timeout=1.0)
    return base.model_copy(update=update)


class Fleet:
    """Reference gateways with sessions that heartbeat, as daemons would."""

    def __init__(self, pool: asyncpg.Pool, subjects: Subjects) -> None:
        self.pool = pool
        self.subjects = subjects
        self.gateways: dict[str, Gateway] = {}
        self.held: dict[str, tuple[Gateway, str, int]] = {}
        self._beat: asyncio.Task[None] | None = None

    async def gateway(
        self,
        gateway_id: str,
        nc: NATS,
        wall: Callable[[], float] = time.time,
        settings: GatewaySettings = GATEWAY_SETTINGS,
        autotick: float | None = 0.2,
    ) -> Gateway:
        """A gateway started (`wall`: its clock for what others read, facts' `observed_at`;
        `autotick` None: it neither flushes nor renews its lease until the test ticks it)."""
        gateway = Provisioned(
            gateway_id, self.pool, nc, self.subjects, wall=wall, settings=settings
        )
        await gateway.start(autotick=autotick)
        self.gateways[gateway_id] = gateway
        return gateway

    async def connect(self, gateway: Gateway, count: int) -> None:
        """`count` nodes joined and connected to `gateway`, heartbeating."""
        nodes = [f"{gateway.gateway_id}-n{i:02d}" for i in range(count)]
        async with self.pool.acquire() as conn:
            for node in nodes:
                await fleet.join(conn, node)
        await self.say(gateway, nodes)

    async def say(self, gateway: Gateway, nodes: list[str]) -> None:
        """Joined `nodes` say Hello to `gateway` (again, after a restart), heartbeating."""
        for node in nodes:
            welcome = await fleet.say_hello(
                gateway,
                HelloRequest(
                    node_id=node,
                    cert_serial=f"{node}-serial",
                    role="worker",
                    boot_id="b1",
                    journal_id="j1",
                ),
            )
            self.held[node] = (gateway, node, welcome.epoch)
        if self._beat is None:
            self._beat = asyncio.create_task(self._heartbeats())

    async def _heartbeats(self) -> None:
        while True:
            for gateway, node, epoch in self.held.values():
                if gateway.alive:
                    with contextlib.suppress(Refused):  # a session ended meanwhile
                        gateway.heartbeat(node, epoch)
            await asyncio.sleep(0.25)

    async def stop(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)
        for gateway in self.gateways.values():
            if gateway.alive:
                await gateway.stop(graceful=False)


class HeldStop:
    """A gateway's graceful stop held open after its sessions ended (the gateway's `ended`
    hook: drained, every session closed and its `closed` fact published, its flush
    stopped) and before its lease is given up — a rolling restart's gateway of thousands,
    which stops slowly — until `go()`."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.ended, self._release = asyncio.Event(), asyncio.Event()
        self._stopping: asyncio.Task[None] | None = None
        gateway.pause = self._hold

    async def _hold(self, point: str, _node: str, _epoch: int) -> None:
        if point == "ended":
            self.ended.set()
            await self._release.wait()

    async def drain_and_stop(self) -> None:
        """Drained, then stopped as far as the hook: its lease still held."""
        await self.gateway.drain()
        self._stopping = asyncio.create_task(self.gateway.stop())
        await asyncio.wait_for(self.ended.wait(), 10)

    async def go(self) -> None:
        """Its stop let go on: its lease given up."""
        assert self._stopping is not None, "drain_and_stop() first"
        self._release.set()
        await self._stopping


async def seen(db: asyncpg.Connection, gateway_id: str) -> bool:
    """The controller applied a flush of the gateway and says it sees it."""
    return bool(
        await db.fetchval(
            "SELECT last_flush_at IS NOT NULL AND blind_since IS NULL FROM liveness_gateways "
            "WHERE gateway_id = $1",
            gateway_id,
        )
    )


async def both_seen(gateways: Fleet, nc: NATS, gw_b: Gateway, db: asyncpg.Connection) -> None:
    """gw-a started with one session, `gw_b` given three, and both seen by the controller
    (a liveness worker running)."""
    await gateways.connect(await gateways.gateway("gw-a", nc), 1)
    await gateways.connect(gw_b, 3)
    for gw in ("gw-a", gw_b.gateway_id):
        await eventually(lambda gw=gw: seen(db, gw), what=f"{gw} seen")  # type: ignore[misc]
