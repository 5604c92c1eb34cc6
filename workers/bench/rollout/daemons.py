"""The rollout's daemons: `workers.sim.daemon.FakeDaemon`s that redial as the seed says
(full jitter, `plan.back_off`; a pushback honoured, or — `honour_pushback=False`, the
power-on comparison — ignored for their own doubling), to the gateway up and not draining
that holds the fewest streams (a least-connections balancer's pick), and `Daemons`, which ticks only those with something to do.

A connected daemon's heartbeats are its gateway's flush (`gateways.RolloutGateway` says
their ages as `bcw bench steady` does): it is ticked only while it redials, runs a
command or owes a result or an event, so a million of them cost nothing at rest.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.notices import Dispatch
from workers.bench.rollout import plan
from workers.bench.rollout.tally import DRAIN_REASON
from workers.gateway import Gateway, Refused
from workers.sim.daemon import FakeDaemon

#: ticks of daemons at once (a herd: many Hellos under way)
AT_ONCE = 512


def streams(gateway: Gateway) -> int:
    """What a least-connections balancer counts of a gateway: its streams, open or opening."""
    return len(gateway.sessions) + gateway.pending_hellos


@dataclass(eq=False)
class RolloutDaemon(FakeDaemon):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.fleet: Daemons | None = None
        self.closed_at: float | None = None  # when a drained gateway closed its session
        self.honour_pushback = True
        self.counted = False  # its first Welcome counted (`Daemons.connects`)

    def _wake(self) -> None:
        if self.fleet is not None:
            self.fleet.active[self.node_id] = self

    def drop(self, reason: str, code: str = "CANCELLED") -> None:
        if reason == DRAIN_REASON and self.fleet is not None and self.node_id in self.fleet.leaving:
            self.closed_at = time.time()
        super().drop(reason, code)
        self._wake()

    async def deliver(self, dispatch: Dispatch) -> None:
        await super().deliver(dispatch)
        self._wake()

    def _back_off(self) -> None:
        self.failures += 1
        self.next_try = self.now() + plan.back_off(self.failures, self.rng.random)

    def _refused(self, gateway: Gateway, refused: Refused) -> None:
        if not self.honour_pushback:  # its own doubling only
            refused = Refused(
                refused.code, refused.reason, None, refused.server_time, refused.challenge
            )
        super()._refused(gateway, refused)

    def _dial(self, gateways: Sequence[Gateway]) -> Gateway | None:
        """The gateway that is up, not draining and holds the fewest streams (its sessions
        and its Hellos under way) — a least-connections balancer's pick, as long-lived
        streams need (a random pick keeps a gateway back from its drain empty, and moves a
        node once for every gateway drained after the one it lands on); ties broken at
        random. But the one whose challenge it holds, if that one is up."""
        draining = self.fleet.draining if self.fleet is not None else set()
        up = [g for g in gateways if g.alive and g.gateway_id not in draining]
        if not up:
            return None
        held = self.server.challenged_by()
        for gateway in up:
            if gateway.gateway_id == held:
                return gateway
        start = self.rng.randrange(len(up))
        return min(up[start:] + up[:start], key=streams)

    async def _connect(self, gateways: Sequence[Gateway]) -> None:
        try:
            await super()._connect(gateways)
        except Exception as error:  # a dial that failed (its gateway stopping): again later
            if self.fleet is not None:
                self.fleet.errors[type(error).__name__] += 1
            self.gateway, self.epoch = None, 0
            self._back_off()
            return
        if self.gateway is not None and self.fleet is not None:
            self.fleet.welcomed(self)

    async def tick(self, gateways: Sequence[Gateway]) -> None:
        """Its redial, its commands and its reports; no heartbeat (its gateway's flush
        says it, as in `bcw bench steady`)."""
        now = self.now()
        if self.gateway is not None and not self.gateway.alive:
            self.drop("gateway gone")
        if self.gateway is None:
            if now >= self.next_try:
                await self._connect(gateways)
            await self._finish_due(now)
            return
        await self._finish_due(now)
        await self._report()

    def state(self) -> str:
        """What it is doing, said (a stuck daemon's, in a run's message)."""
        gateway = self.gateway.gateway_id if self.gateway is not None else None
        return (
            f"{self.node_id} on {gateway} epoch {self.epoch}, next try in "
            f"{self.next_try - self.now():.1f} s, refusals {dict(self.refusals)}, "
            f"active {self.fleet is not None and self.node_id in self.fleet.active}"
        )

    def settled(self) -> bool:
        """Connected with nothing to do until a notice comes: not ticked."""
        return (
            self.gateway is not None
            and self.gateway.alive
            and not self.running
            and all(c in self.in_hello for c in self.results)
            and (not self.journal or self.journal[-1]["seq"] <= self.sent_seq)
        )

    def due(self, now: float) -> bool:
        if self.gateway is None:
            return now >= self.next_try
        return not self.settled() and (
            not self.running
            or any(r.finish_at <= now for r in self.running.values())
            or any(c not in self.in_hello for c in self.results)
            or bool(self.journal and self.journal[-1]["seq"] > self.sent_seq)
        )


class Daemons:
    """The fleet's daemons, and the loop that ticks those with something to do."""

    def __init__(self, daemons: Sequence[RolloutDaemon], gateways: list[Gateway]) -> None:
        self.all = list(daemons)
        self.gateways = gateways  # replaced in place when a gateway comes back
        self.active: dict[str, RolloutDaemon] = {}
        self.draining: set[str] = set()
        self.reconnects: list[float] = []  # seconds, close at a drained gateway → Welcome
        self.connects: list[float] = []  # seconds since `started`, each first Welcome
        self.welcomes = 0
        self.errors: Counter[str] = Counter()  # dials that failed otherwise than refused
        #: drained gateway → its sessions' nodes not welcomed elsewhere yet
        self.away: dict[str, set[str]] = {}
        #: node → the drained gateway it leaves, and when that gateway began closing
        self.leaving: dict[str, tuple[str, float]] = {}
        #: sessions a drained gateway held for a daemon that had gone elsewhere (none)
        self.stale = 0
        self.by_node = {d.node_id: d for d in self.all}
        self.started = time.time()
        for daemon in self.all:
            daemon.fleet = self

    def leave(self, gateway: Gateway) -> int:
        """`gateway` is about to close its sessions: each must be welcomed elsewhere.
        Returns how many."""
        now, nodes = time.time(), set()
        for node in gateway.sessions:
            if self.by_node[node].gateway is gateway:
                self.leaving[node] = (gateway.gateway_id, now)
                nodes.add(node)
            else:
                self.stale += 1
        self.away[gateway.gateway_id] = nodes
        return len(nodes)

    def welcomed(self, daemon: RolloutDaemon) -> None:
        self.welcomes += 1
        now = time.time()
        left = self.leaving.get(daemon.node_id)
        if left is not None and daemon.gateway is not None:
            if daemon.gateway.gateway_id == left[0]:
                return  # not elsewhere (never: it is draining)
            del self.leaving[daemon.node_id]
            self.reconnects.append(now - (daemon.closed_at or left[1]))
            self.away[left[0]].discard(daemon.node_id)
            daemon.closed_at = None
        elif not daemon.counted:  # its first Welcome (one it kept)
            daemon.counted = True
            self.connects.append(now - self.started)

    def runs(self) -> list[dict[uuid.UUID, int]]:
        return [dict(d.runs) for d in self.all if d.runs]

    async def run(self, stopping: asyncio.Event, interval: float = 0.05) -> None:
        """Tick every daemon with something due, AT_ONCE at most, in rounds: a round ends
        when its slowest tick does. (Ticking each beside the others, never waiting for a
        round, kept 512 Hellos always under way: at a 10,000-daemon power-on the two
        gateways, on one process's CPU and a pool of 16, renewed their leases too late and
        lost them.)"""
        limit = asyncio.Semaphore(AT_ONCE)

        async def one(daemon: RolloutDaemon) -> None:
            async with limit:
                await daemon.tick(self.gateways)

        while not stopping.is_set():
            now = time.time()
            for node in [n for n, d in self.active.items() if d.settled()]:
                del self.active[node]
            due = [d for d in self.active.values() if d.due(now)]
            for failed in await asyncio.gather(*(one(d) for d in due), return_exceptions=True):
                if isinstance(failed, Exception):  # counted (the run says them), never fatal
                    self.errors[type(failed).__name__] += 1
            await asyncio.sleep(interval)
