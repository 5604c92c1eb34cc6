"""The world the model of the seed and the attacker acts in: real nats-server and
PostgreSQL, the five workers (each a runtime of its own in this event loop, so that one can
be stopped and started late), reference gateways and fake daemons whose clock is the
database's (`compute_now()`'s offset). Nothing is mocked; what the world adds is what it
watches: each daemon's deliveries and finished runs, the facts a gateway holds back (a late
answer, as sourced streams and replicas deliver it), and what a step expects.

The participants of one example: `NODES` nodes, each with its honest daemon (signing with
the node's enrolled Hello key), maybe a clone (the same certificate and key on a second
machine: another boot), and an attacker's daemon that cannot sign, through the hostile
gateway; `GATEWAYS` honest gateways and the hostile one.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import nats
import nats.js.errors
from nats.aio.client import Client as NATS

from schemas.facts import Fact, Progress, Rejected, Result
from schemas.notices import Dispatch
from schemas.subjects import Subjects
from tests.integration.fleet import Provisioned
from tests.integration.support import OUTBOX_LEFT, running
from workers.demo.run import demo_settings, fresh_sweep_history
from workers.gateway import Gateway, Refused
from workers.gateway.types import GatewaySettings
from workers.registry import WORKERS
from workers.settings import Settings
from workers.sim.clock import SimClock
from workers.sim.daemon import FakeDaemon

NODES = 2
GATEWAYS = 2
#: how far the clock moves in one step of settling (seconds)
STEP = 1.0
ANSWERS = (Progress, Result, Rejected)


@dataclass
class Watch:
    """What reached one daemon (one machine, or the attacker)."""

    label: str
    node_id: str
    deliveries: list[tuple[int, uuid.UUID]] = field(default_factory=list)  # (its epoch, command)


@dataclass
class Node:
    node_id: str
    serial: str
    key: bytes
    honest: FakeDaemon
    clone: FakeDaemon | None = None
    attacker: FakeDaemon | None = None
    epochs: list[int] = field(default_factory=list)  # node_sessions.session_epoch as seen


class HeldAnswers:
    """A gateway's publisher that, while `holding`, keeps its answers (progress, results,
    rejections) back, to publish them late (`release`): the order a sourced stream or a
    second replica may deliver them in."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.publish = gateway.facts.publish
        self.holding = False
        self.held: list[Fact] = []
        self.true_results: list[Result] = []  # every result this honest gateway published
        gateway.facts.publish = self._publish  # type: ignore[method-assign]

    async def _publish(self, fact: Fact) -> None:
        if isinstance(fact, Result):
            self.true_results.append(fact)
        if self.holding and isinstance(fact, ANSWERS):
            self.held.append(fact)
            return
        await self.publish(fact)

    async def release(self) -> None:
        held, self.held = self.held, []
        self.holding = False
        for fact in held:
            await self.publish(fact)


class World:
    """One per test: the servers, the workers and the clock, shared by every example;
    `begin()` makes an example's own nodes and gateways, `end()` closes them."""

    def __init__(self, nats_url: str, database_url: str, policy: str) -> None:
        self.nats_url = nats_url
        self.database_url = database_url
        self.policy = policy
        self.subjects = Subjects(root=f"m{uuid.uuid4().hex[:10]}")
        self.clock = SimClock()
        self.rng = random.Random(58)
        self.workers: dict[str, contextlib.AsyncExitStack] = {}
        self.example = 0
        self.nodes: list[Node] = []
        self.gateways: list[Gateway] = []
        self.hostile: Gateway | None = None
        self.answers: dict[str, HeldAnswers] = {}
        self.watch: dict[int, Watch] = {}  # by id() of the daemon
        #: every dispatch a gateway was sent: (node, epoch, command)
        self.sent: set[tuple[str, int, uuid.UUID]] = set()

    # -- the servers and workers -------------------------------------------------------------
    async def start(self) -> None:
        self.nc: NATS = await nats.connect(self.nats_url, max_reconnect_attempts=-1)
        self.pool: asyncpg.Pool = await asyncpg.create_pool(
            self.database_url, min_size=2, max_size=12
        )
        async with self.pool.acquire() as conn:
            await self.clock.reset(conn)
            await conn.execute("UPDATE fleet_policy SET hello_proof = $1", self.policy)
        await fresh_sweep_history(self.pool)
        base = demo_settings(self.nats_url, self.database_url, self.subjects.root)
        self.settings: Settings = base
        for name in WORKERS:
            await self.start_worker(name)

    async def stop(self) -> None:
        for name in list(self.workers):
            await self.stop_worker(name)
        async with self.pool.acquire() as conn:
            await self.clock.reset(conn)
        await self.pool.close()
        await self.nc.close()

    async def start_worker(self, name: str) -> None:
        if name in self.workers:
            return
        stack = contextlib.AsyncExitStack()
        await stack.enter_async_context(running(self.settings, [WORKERS[name](self.settings)]))
        self.workers[name] = stack

    async def stop_worker(self, name: str) -> None:
        stack = self.workers.pop(name, None)
        if stack is not None:
            await stack.aclose()

    # -- one example's participants ------------------------------------------------------------
    async def begin(self) -> None:
        self.example += 1
        prefix = f"x{self.example}"
        self.nodes, self.gateways, self.answers, self.watch = [], [], {}, {}
        async with self.pool.acquire() as conn:
            await self.clock.advance(conn, 3600.0)  # the last example's windows are long past
            await conn.execute(
                "UPDATE liveness_sweeps SET last_sweep_at = compute_now(), grace_until = NULL"
            )
            for i in range(NODES):
                node_id, serial, key = (
                    f"{prefix}-n{i}",
                    f"{prefix}-serial-{i}",
                    self.rng.randbytes(32),
                )
                await conn.execute("SELECT join_node($1, 'worker', $2, NULL)", node_id, serial)
                await conn.execute("SELECT enroll_hello_key($1, $2)", node_id, key)
                honest = self._daemon(node_id, serial, key, home=i % GATEWAYS)
                self.nodes.append(Node(node_id, serial, key, honest))
        for g in range(GATEWAYS):
            self.gateways.append(await self._gateway(f"{prefix}-gw{g}"))
        self.hostile = await self._gateway(f"{prefix}-evil")

    async def end(self) -> None:
        js = self.nc.jetstream()
        for gateway in [*self.gateways, *([self.hostile] if self.hostile else [])]:
            if gateway.alive:
                await gateway.stop(graceful=True)
            with contextlib.suppress(
                nats.js.errors.NotFoundError
            ):  # the stream's consumers are few
                await js.delete_consumer(self.subjects.gateway_stream, f"gw-{gateway.gateway_id}")

    async def _gateway(self, gateway_id: str) -> Gateway:
        gateway = Provisioned(
            gateway_id, self.pool, self.nc, self.subjects, self.clock, self.clock, GatewaySettings()
        )
        await gateway.start(autotick=None)
        self.answers[gateway_id] = HeldAnswers(gateway)
        act = gateway.notices._act

        async def acted(notice: object) -> None:  # what a gateway was sent, it knows
            if isinstance(notice, Dispatch):
                self.sent.add((notice.node_id, notice.epoch, notice.command_id))
            await act(notice)

        gateway.notices._act = acted  # type: ignore[method-assign]
        return gateway

    def _daemon(
        self, node_id: str, serial: str, key: bytes | None, home: int, label: str = "honest"
    ) -> FakeDaemon:
        daemon = FakeDaemon(
            node_id,
            serial,
            self.clock,
            self.rng,
            home=home,
            hello_key=key,
            work_seconds=(0.5, 2.0),
            lane_credits=2,  # fewer than the gateway sends: BUSY answers
        )
        self._watched(daemon, f"{label}:{node_id}")
        return daemon

    def _watched(self, daemon: FakeDaemon, label: str) -> None:
        """Record what reaches `daemon` (what it runs it counts itself: `runs`, `cut_off`)."""
        watch = self.watch[id(daemon)] = Watch(label, daemon.node_id)
        deliver = daemon.deliver

        async def delivered(dispatch: Dispatch) -> None:
            watch.deliveries.append((daemon.epoch, dispatch.command_id))
            assert dispatch.epoch == daemon.epoch, f"{label}: a dispatch of another epoch"
            await deliver(dispatch)

        daemon.deliver = delivered  # type: ignore[method-assign]

    def clone_of(self, node: Node) -> FakeDaemon:
        if node.clone is None:
            node.clone = node.honest.clone(home=0)
            node.clone.partitioned = True  # it dials only when a step says so
            self._watched(node.clone, f"clone:{node.node_id}")
        return node.clone

    def attacker_of(self, node: Node) -> FakeDaemon:
        if node.attacker is None:
            node.attacker = self._daemon(
                node.node_id, f"{node.node_id}-forged", None, home=0, label="attacker"
            )
            node.attacker.capabilities = ["evil"]
            node.attacker.partitioned = True
        return node.attacker

    def daemons(self) -> list[FakeDaemon]:
        return [d for n in self.nodes for d in (n.honest, n.clone, n.attacker) if d is not None]

    def delivered(self, node_id: str, epoch: int) -> set[uuid.UUID]:
        """The commands sent to `node_id`'s session of `epoch`: what its gateway knows of,
        whether or not they reached the daemon."""
        return {c for n, e, c in self.sent if n == node_id and e == epoch}

    # -- acts ------------------------------------------------------------------------------------
    async def dial(self, daemon: FakeDaemon, gateway: Gateway) -> bool:
        """`daemon` says Hello to `gateway` now (closing its own session first); whether it
        was welcomed."""
        if daemon.gateway is not None and daemon.gateway.alive:
            await daemon.gateway.disconnect(daemon.node_id, daemon.epoch)
        daemon.drop("redial")
        partitioned, daemon.partitioned = daemon.partitioned, False
        daemon.next_try = daemon.now()
        try:
            await daemon.tick([gateway])
        except Refused:
            pass
        finally:
            daemon.partitioned = partitioned
        return daemon.gateway is not None

    async def advance(self, seconds: float) -> None:
        """Move the clock `seconds`, the gateways and daemons ticking at least every
        `STEP` (a gateway renews its lease, 15 s, every 5 s)."""
        while seconds > 0:
            step = min(seconds, STEP)
            async with self.pool.acquire() as conn:
                await self.clock.advance(conn, step)
            seconds -= step
            if seconds > 0:
                await self.tick()
                await asyncio.sleep(0.01)

    async def tick(self) -> None:
        live = [g for g in self.gateways if g.alive]
        for gateway in [*live, *([self.hostile] if self.hostile else [])]:
            await gateway.tick()
        for node in self.nodes:
            for daemon in (node.honest, node.clone, node.attacker):
                if daemon is not None and (daemon.gateway is not None or daemon is node.honest):
                    await daemon.tick(live)

    async def quiet(self) -> bool:
        """Nothing under way: the outbox empty, every running worker's consumer and every
        gateway's notices delivered and settled, no daemon with work running."""
        js = self.nc.jetstream()
        async with self.pool.acquire() as conn:
            if await conn.fetchval(OUTBOX_LEFT):
                return False
        for name in self.workers:
            info = await js.consumer_info(self.subjects.facts_stream, name)
            if info.num_pending or info.num_ack_pending:
                return False
        for gateway in [*self.gateways, *([self.hostile] if self.hostile else [])]:
            if not gateway.alive:
                continue
            info = await js.consumer_info(self.subjects.gateway_stream, f"gw-{gateway.gateway_id}")
            if info.num_pending or info.num_ack_pending:
                return False
        return not any(
            d is not None and d.running for n in self.nodes for d in (n.honest, n.clone, n.attacker)
        )

    async def settle(self, moving: bool = True, within: float = 40.0) -> None:
        """Let the world run until it is quiet twice in a row: the gateways and daemons
        tick, and (`moving`) the clock moves `STEP` a round. Unmoving, they tick all the
        same: a command dispatched after the world last looked quiet (the dispatch loop
        woke late on a busy machine) is run and answered, never left running."""
        quiet = 0
        deadline = asyncio.get_running_loop().time() + within
        while quiet < 2:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"the world did not settle in {within} s")
            await self.tick()
            if moving:
                await self.advance(STEP)
            await asyncio.sleep(0.05)
            quiet = quiet + 1 if await self.quiet() else 0

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        async with self.pool.acquire() as conn:
            return list(await conn.fetch(sql, *args))

    async def val(self, sql: str, *args: Any) -> Any:
        async with self.pool.acquire() as conn:
            return await conn.fetchval(sql, *args)


def run(loop: asyncio.AbstractEventLoop, work: Callable[[], Awaitable[Any]]) -> Any:
    return loop.run_until_complete(work())
