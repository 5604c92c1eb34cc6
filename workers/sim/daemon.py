"""A fake daemon (`bcd`): what a node does on its side of the stream, in memory.

Says Hello with its capabilities (bcd's, unless a skew profile of `workers.sim.profiles`
gives others), running commands, the done results not acked yet and the trust it holds,
proven by its key (`workers.sim.servertime`: its own clock, or the server's challenge);
honours the Welcome's `acked_event_seq` (forgets those events) and `credits` (at most that
many per lane), and never fences on the epoch; heartbeats; runs dispatched commands within
its own credits per lane and answers BUSY when a lane (or its journal) is full; acks,
runs and completes them (a `node.reboot` reboots it, a `daemon.upgrade` upgrades it);
journals each result and keeps it until acked, and answers a duplicate delivery of a
finished command from its journal (`workers.sim.journal`), never running it again;
applies the desired state the gateway sends; journals events and trims them when acked;
reconnects with full-jitter back-off `min(60 s, 1 s * 2^n)`, reset by a Welcome, and
honours a gateway's pushback (a negative or malformed one is ignored; its doubling
restarts after one). A new process (restart, upgrade, reboot, crash) holds no command of
the old one. Its working clock never moves back. Its heartbeats carry its free credits,
its NodeLoad and the generation it applied, and their answers move its server-time mark
forward; the first heartbeat after its inventory changed, and every 10th, carry its
inventory hashes. It can reboot, crash, lose its journal, be cloned and be upgraded.
Driven by `tick()`.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.facts import NodeLoad
from schemas.notices import Dispatch
from workers.gateway import Gateway, Refused
from workers.gateway.admission import DesiredState
from workers.gateway.inventory import INVENTORY_EVERY
from workers.sim.hello import Hellos
from workers.sim.journal import Finished
from workers.sim.profiles import BCD_CAPABILITIES, BCD_VERSION
from workers.sim.reports import Reports
from workers.sim.servertime import ServerTime

HEARTBEAT = 10.0
#: a journal this full takes no new command: it answers BUSY until events are acked
JOURNAL_MAX = 10_000
#: the reconnect back-off's cap: min(60 s, 1 s * 2^n), full jitter
MAX_BACK_OFF = 60.0


@dataclass
class _Running:
    dispatch: Dispatch
    finish_at: float


@dataclass
class FakeDaemon(Hellos, Reports):
    node_id: str
    serial: str
    clock: Callable[[], float]
    rng: random.Random
    capabilities: list[str] = field(default_factory=lambda: list(BCD_CAPABILITIES))
    version: str = BCD_VERSION
    lane_credits: int = 4
    work_seconds: tuple[float, float] = (0.2, 1.0)
    transport: str = "grpc"
    boot_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    journal_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    home: int = 0  # index of the gateway it prefers
    memory_available_bytes: int = 24 * 2**30
    #: the key it proves its Hellos with (None: a daemon that does not sign)
    hello_key: bytes | None = None
    trust_version: int = 1  # of the trust bundle it holds
    #: the approver set it holds: (epoch, sha256), or None
    approver_set: tuple[int, str] | None = None
    #: when its certificate expires, in server time (None: it does not say)
    cert_not_after: float | None = None

    def __post_init__(self) -> None:
        self._now = float("-inf")  # its working clock: never moves back
        self.gateway: Gateway | None = None
        self.epoch = 0
        self.failures = 0  # reconnect attempts since the last Welcome
        self.next_try = 0.0
        self.partitioned = False  # cannot reach any gateway
        self.running: dict[uuid.UUID, _Running] = {}
        self.finished = Finished()  # its journal of finished commands (`results` owed)
        #: how many times it started each command, and how many of those runs a new
        #: process cut off (never reset, not even by a lost journal: what tests count)
        self.runs: Counter[uuid.UUID] = Counter()
        self.cut_off: Counter[uuid.UUID] = Counter()
        self.answered = 0  # duplicate deliveries answered from its journal
        self.in_hello: set[uuid.UUID] = set()  # results this session's Hello carried
        self.spec_hash: str | None = None  # of the desired state it applied
        self.journal: list[dict[str, Any]] = []
        self.next_seq = 1
        self.sent_seq = 0
        self.last_heartbeat = 0.0
        self.refusals: Counter[str] = Counter()
        self.busy_answers = 0
        self.welcomes = 0
        self.welcome_credits = self.lane_credits  # what its last Welcome allows per lane
        self.generation = 0  # the configuration generation it applied (heartbeats say)
        self.inventory: dict[str, dict[str, Any]] = {
            "hardware": {"cpus": 8, "memory_gib": 32},
            "capabilities": {"names": sorted(self.capabilities)},
        }
        self.heartbeats = 0
        self.sections_sent = 0
        self.process_started = self.now()  # its Hello's proof of a restart
        self.server = ServerTime()  # its mark, its clock offset, a challenge held
        self.told: dict[str, str] = {}  # the inventory hashes it last told its gateway
        self.behind_welcomes = 0  # Welcomes and refusals behind the mark: not believed
        self.distrusted: Gateway | None = None  # the gateway of the last such answer

    def now(self) -> float:
        """Its working clock: the clock it is given, but never back (a step back of the
        host's clock would otherwise stretch every timer it holds)."""
        self._now = max(self._now, self.clock())
        return self._now

    @property
    def results(self) -> dict[uuid.UUID, dict[str, Any]]:
        """Done results the control plane has not acked: sent as result frames while
        connected, carried by the next Hello otherwise, forgotten only once acked."""
        return self.finished.unacked

    @property
    def server_time_mark(self) -> float:
        return self.server.mark

    # -- the stream, as the gateway sees it --------------------------------------------
    async def deliver(self, dispatch: Dispatch) -> None:
        gateway = self.gateway
        if gateway is None:
            return
        if dispatch.command_id in self.running:
            return  # a replay of what runs already
        in_lane = sum(1 for r in self.running.values() if r.dispatch.lane == dispatch.lane)
        try:  # never fenced on the epoch: the gateway delivers only its session's
            done = self.finished.answer(dispatch.command_id)
            if done is not None:  # finished: answered from its journal, never run again
                self.answered += 1
                await self._send_result(gateway, dispatch.command_id, done)
                return
            if in_lane >= self.credits_per_lane or len(self.journal) >= JOURNAL_MAX:
                self.busy_answers += 1
                await gateway.busy(self.node_id, self.epoch, dispatch.command_id)
                return
            self.runs[dispatch.command_id] += 1
            self.running[dispatch.command_id] = _Running(
                dispatch, self.now() + self.rng.uniform(*self.work_seconds)
            )
            await gateway.progress(self.node_id, self.epoch, dispatch.command_id, "acked")
            await gateway.progress(self.node_id, self.epoch, dispatch.command_id, "running")
        except Refused:  # the session ended meanwhile: the next one replays it
            self.drop("refused")

    async def event_ack(self, journal_id: str, seq: int) -> None:
        if journal_id == self.journal_id:
            self.journal = [e for e in self.journal if e["seq"] > seq]

    async def ack_results(self, command_ids: Sequence[uuid.UUID]) -> None:
        """The results its Hello carried are stored: owed no more."""
        acked = self.finished.ack(command_ids, self.now())
        if acked:
            self._journal("results.acked", {"command_ids": [str(c) for c in acked]})

    async def desired_state(self, desired: DesiredState) -> None:
        """Apply the node's desired state, its hash that of the bytes it was sent (its
        heartbeats then report the generation)."""
        if self.gateway is None:
            return
        self.generation = desired.generation
        self.spec_hash = hashlib.sha256(desired.body.encode()).hexdigest()
        self._journal("desired-state.applied", {"generation": desired.generation})
        epoch, approvers = self.epoch, self.approver_set or (None, None)
        try:  # its status report: what it applied and the trust it holds
            await self.gateway.status(
                self.node_id, epoch, desired.generation, self.trust_version, *approvers
            )
        except Refused:
            self.drop("refused")

    def drop(self, reason: str, code: str = "CANCELLED") -> None:
        self.gateway = None
        self.epoch = 0
        self._back_off()

    # -- what the simulator does to it ---------------------------------------------------
    def reboot(self) -> None:
        """A new boot: whatever ran is gone (its journal stays); reconnect at once."""
        self.boot_id = uuid.uuid4().hex[:12]
        self._restart()

    def lose_journal(self) -> None:
        """A reinstalled disk: new journal, nothing remembered (no result, no finished
        command: what `journal-lost` means)."""
        self.journal_id = uuid.uuid4().hex[:12]
        self.journal.clear()
        self.next_seq, self.sent_seq = 1, 0
        self.finished = Finished()
        self.boot_id = uuid.uuid4().hex[:12]
        self._restart()

    def upgrade(self, version: str) -> None:
        self.version = version
        self._restart()

    def clone(self, home: int) -> FakeDaemon:
        """The same identity (certificate) on a second machine: another boot id."""
        return FakeDaemon(
            self.node_id,
            self.serial,
            self.clock,
            self.rng,
            list(self.capabilities),
            self.version,
            self.lane_credits,
            self.work_seconds,
            home=home,
            hello_key=self.hello_key,
        )

    def crash(self) -> None:
        """Its process dies and starts again (same boot, same journal: what finished is
        still answered from it)."""
        self._restart()

    def _restart(self) -> None:
        """A new daemon process (reboot, upgrade, restart, crash): it holds no command of
        the old one (their replay re-sends what did not finish: cut off, they run again);
        reconnect at once."""
        self.cut_off.update(list(self.running))
        self.running.clear()
        self.process_started = self.now()
        self.gateway = None
        self.epoch = 0
        self.failures = 0
        self.next_try = self.now()

    def _back_off(self) -> None:
        self.failures += 1
        self.next_try = self.now() + self.rng.uniform(
            0, min(MAX_BACK_OFF, 2.0 ** min(self.failures, 32))
        )  # full jitter

    def node_load(self) -> NodeLoad:
        """What its heartbeats say of its load."""
        return NodeLoad(
            load_average=float(len(self.running)),
            memory_available_bytes=self.memory_available_bytes,
            running_commands=len(self.running),
            pending_events=sum(1 for e in self.journal if e["seq"] > self.sent_seq),
        )

    def free_credits(self) -> dict[str, int]:
        """What its heartbeats report: free credits per lane it knows of."""
        lanes = {"default", "system", *(r.dispatch.lane for r in self.running.values())}
        used = Counter(r.dispatch.lane for r in self.running.values())
        return {lane: max(0, self.credits_per_lane - used[lane]) for lane in sorted(lanes)}

    @property
    def credits_per_lane(self) -> int:
        """Its own capacity per lane, never above what its gateway's Welcome allows."""
        return min(self.lane_credits, self.welcome_credits)

    @property
    def connected(self) -> bool:
        return self.gateway is not None and self.gateway.alive

    # -- time passes ---------------------------------------------------------------------
    def idle(self, now: float) -> bool:
        """Whether a tick at `now` would do nothing: no reconnect, heartbeat, finished
        command, result or journal event due. Most daemons are idle at most ticks; the
        simulator starts no task for them (a thousand a tick would cost it most of its
        CPU, and starve the workers it runs beside on a loaded machine)."""
        if any(run.finish_at <= now for run in self.running.values()):
            return False
        gateway = self.gateway
        if gateway is None:
            return self.partitioned or now < self.next_try
        return (
            gateway.alive
            and now - self.last_heartbeat < HEARTBEAT
            and all(command_id in self.in_hello for command_id in self.results)
            and (not self.journal or self.journal[-1]["seq"] <= self.sent_seq)
        )

    @property
    def expired(self) -> bool:
        """Its certificate expired by its working clock in server time (the mark, its own
        clock through the offset, never back): it says Hello no more."""
        server_clock = self.server.now(self.now())
        return self.cert_not_after is not None and server_clock >= self.cert_not_after

    async def tick(self, gateways: Sequence[Gateway]) -> None:
        now = self.now()
        if self.expired:  # ends its session, and waits for a new certificate
            gateway, epoch = self.gateway, self.epoch
            self.gateway, self.epoch = None, 0
            if gateway is not None and gateway.alive:
                await gateway.disconnect(self.node_id, epoch, "certificate-expired")
            return
        if self.gateway is not None and not self.gateway.alive:
            self.drop("gateway gone")
        if self.gateway is None:
            if not self.partitioned and now >= self.next_try:
                await self._connect(gateways)
            await self._finish_due(now)
            return
        if now - self.last_heartbeat >= HEARTBEAT:
            self.last_heartbeat = now
            self.heartbeats += 1
            # collected again since it told the hashes: it pushes the changed sections, and
            # this heartbeat tells the hashes (as every 10th does anyway)
            hashes = self.inventory_hashes()
            tell = hashes != self.told or self.heartbeats % INVENTORY_EVERY == 0
            await self._send_sections(sorted(s for s in hashes if self.told.get(s) != hashes[s]))
            if self.gateway is None:
                return
            try:
                ack = self.gateway.heartbeat(
                    self.node_id,
                    self.epoch,
                    self.free_credits(),
                    load=self.node_load(),
                    applied_generation=self.generation,
                    inventory_hashes=hashes if tell else None,
                )
            except Refused:  # its session ended meanwhile: say Hello again
                self.drop("refused")
                return
            if tell:
                self.told = hashes
            self.server.told(ack.server_time, self.now())  # its mark moves forward
            await self._send_sections(ack.request_sections)
        await self._finish_due(now)
        await self._report()

    async def _finish_due(self, now: float) -> None:
        for command_id, run in list(self.running.items()):
            if run.finish_at > now:
                continue
            del self.running[command_id]
            kind = run.dispatch.kind
            if kind == "node.reboot":
                self.reboot()
                return
            if kind == "daemon.upgrade":
                self.upgrade(str(run.dispatch.payload.get("target_version", self.version)))
                return
            if kind == "daemon.restart":  # no result: its new process is the proof
                self._restart()
                return
            self._journal("command.finished", {"command_id": str(command_id), "kind": kind})
            self.finished.finish(command_id, "done", {"exit": 0}, None, now)
