"""The reference gateway core: what a gateway does between its daemons and the bus.

A library (no network server of its own): a daemon object calls `hello()`, `heartbeat()`
and reports progress, results, BUSY answers, events and status; the gateway admits the
Hello, runs the Hello transaction under its lease, publishes the session facts after
commit (at least once), keeps last-seen in memory and flushes it every 15 s, times out
silent sessions, and obeys the notices workers send it (dispatch, zombie, event-ack,
revocations). `tick()` drives the periodic work, so a simulator can move time.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from opentelemetry import context, trace
from pydantic import ValidationError

from schemas.subjects import Subjects
from workers.gateway import store
from workers.gateway.admission import (
    Code,
    HelloRequest,
    RateMeter,
    admit,
    busy_pushback,
    desired_state_due,
    pushback,
    upgrade_required,
)
from workers.gateway.endings import Endings
from workers.gateway.facts import FactPublisher
from workers.gateway.frames import Frames
from workers.gateway.inventory import sections_to_request
from workers.gateway.notices import Notices
from workers.gateway.types import (
    DaemonStream,
    GatewaySettings,
    Opening,
    Refused,
    Session,
    TokenBucket,
    Welcome,
)
from workers.gateway.welcome import follow as follow_welcome
from workers.gateway.welcome import publish_hello
from workers.runtime.observability import tracing

log = logging.getLogger(__name__)

#: seconds between a started gateway's own ticks (its liveness loop and lease renewal)
LIVENESS_LOOP = 5.0
#: why a duplicate identity's Hello is refused once the quarantine revoked its certificate
QUARANTINED = "certificate quarantined: duplicate identity"


@dataclass
class Gateway(Frames, Endings):
    gateway_id: str
    pool: asyncpg.Pool
    nc: NATS
    subjects: Subjects
    #: seconds, for silence, lease renewal and flush periods: monotonic, so a step of the
    #: host's clock (NTP) drops no stream (the simulator's follows compute_now())
    clock: Callable[[], float] = time.monotonic
    #: seconds since the epoch, for what others read: a Welcome's server time, facts'
    #: observed_at, certificate expiry (the simulator's follows compute_now())
    wall: Callable[[], float] = time.time
    settings: GatewaySettings = field(default_factory=GatewaySettings)
    #: spans of Hellos, published facts and obeyed notices (default: the global provider's)
    tracer: trace.Tracer = field(default_factory=lambda: trace.get_tracer(tracing.TRACER_NAME))
    #: a test's hook, awaited in each Hello with (point, node, epoch) at `committed` (the
    #: Hello transaction committed, the session not registered yet) and `registered` (not
    #: welcomed yet), and in a graceful `stop()` at `ended` (node "", epoch 0: every session
    #: ended, the lease not given up yet): it holds those windows open
    pause: Callable[[str, str, int], Awaitable[None]] | None = None
    #: the lease's own connections (take, renew, drain, give up); None: `pool`. A Hello
    #: storm queues hundreds of calls on `pool`, and a renewal behind them for longer
    #: than the lease lost it, every session with it (a herd of its own)
    lease_pool: asyncpg.Pool | None = None

    def __post_init__(self) -> None:
        self.js: JetStreamContext = self.nc.jetstream()
        self.facts = FactPublisher(self.gateway_id, self.js, self.subjects, self.wall, self.tracer)
        self.lease_epoch: int | None = None
        self.sessions: dict[str, Session] = {}
        self.opening: dict[str, Opening] = {}  # Hellos under way, by node
        self.bucket = TokenBucket(self.settings.handshakes_per_second)
        self.pending_hellos = 0
        self._hellos_ended = RateMeter()  # Hello transactions ended (a busy refusal's pushback)
        self._renewed_at = 0.0
        self._flushed_at = 0.0
        self._tasks: set[asyncio.Task[None]] = set()  # running: each leaves it when done
        self._flushing: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.notices = Notices(
            self.gateway_id,
            self.nc,
            self.subjects,
            self.facts,
            self.sessions,
            self._end,
            self.opening,
        )

    # -- life ------------------------------------------------------------------------------
    async def start(self, autotick: float | None = LIVENESS_LOOP) -> None:
        """Take the lease and follow the notices, and tick every `autotick` seconds by
        itself (5 s: renew the lease, time out silent sessions, flush); None: the caller
        ticks it instead (a simulator does, to move time)."""
        async with self._leases.acquire() as conn:
            self.lease_epoch = await store.acquire(
                conn, self.gateway_id, timedelta(seconds=self.settings.lease_ttl)
            )
        # its first tick flushes at once: a gateway back from a drain before the controller
        # called it gone holds the sight of its last life, a flush period old already;
        # flushed only a period after its start, it was called blind meanwhile
        self._renewed_at = self.clock()
        self._flushed_at = self._renewed_at - self.settings.flush_period
        await self.notices.start()
        self._spawn(self.notices.follow(self._stopping), "notices")
        if autotick is not None:
            self._spawn(self._ticking(autotick), "tick")

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` beside the gateway's other work (until it ends, or `stop()`)."""
        task = asyncio.create_task(work, name=f"{self.gateway_id}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ticking(self, every: float) -> None:
        while not self._stopping.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("gateway %s tick failed", self.gateway_id)
            await asyncio.sleep(every)

    async def stop(self, graceful: bool = True) -> None:
        """Graceful: close every session (`gateway-shutdown`). Not graceful: a crash.
        Stopping a stopped gateway (one that lost its lease, say) does nothing."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._flushing is not None:
            self._tasks.add(self._flushing)
        others = [t for t in self._tasks if t is not asyncio.current_task()]  # tick() may stop us
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await self.notices.stop()
        if graceful and self.lease_epoch is not None:
            await self._end_all("gateway-shutdown")
            await self._paused("ended", "", 0)
            try:  # its sessions closed: the lease is given up, not left to expire
                async with self._leases.acquire() as conn:
                    await store.release(conn, self.gateway_id, self.lease_epoch)
            except Exception as error:  # it expires by itself within its TTL
                log.warning("gateway %s: lease not released (%r)", self.gateway_id, error)
        self.sessions.clear()
        self.opening.clear()

    async def drain(self, draining: bool = True) -> None:
        """Refuse new Hellos from now on (their nodes go to other gateways) and keep the
        sessions held; or take Hellos again. LeaseGone when the lease was lost."""
        assert self.lease_epoch is not None, "start() first"
        async with self._leases.acquire() as conn:
            await store.drain(conn, self.gateway_id, self.lease_epoch, draining)

    @property
    def _leases(self) -> asyncpg.Pool:
        return self.lease_pool or self.pool

    @property
    def alive(self) -> bool:
        return not self._stopping.is_set()

    # -- the daemon's calls -----------------------------------------------------------------
    async def hello(self, request: HelloRequest, stream: DaemonStream) -> Welcome:
        if not self.alive or self.lease_epoch is None:
            raise Refused(Code.UNAVAILABLE, "gateway stopped")
        if not self.notices.present:  # not started, as the seed says: no command would reach it
            raise Refused(Code.UNAVAILABLE, "notices consumer missing", retry_after=pushback(5.0))
        if len(self.sessions) >= self.settings.max_streams and request.node_id not in self.sessions:
            raise Refused(Code.RESOURCE_EXHAUSTED, "maxStreams reached", retry_after=pushback(1.0))
        if self.pending_hellos >= self.settings.max_pending_hellos:  # back once they ended
            ended = self._hellos_ended.per_second(self.clock())
            wait = busy_pushback(self.pending_hellos, ended)
            raise Refused(
                Code.RESOURCE_EXHAUSTED, "maxPendingHellos reached", retry_after=pushback(wait)
            )
        wait = self.bucket.take()
        if wait > 0:
            raise Refused(
                Code.RESOURCE_EXHAUSTED, "handshake rate limit", retry_after=pushback(wait)
            )
        self.pending_hellos += 1
        opening = self.opening[request.node_id] = Opening()
        try:
            span = self.tracer.start_span(
                "Hello",
                kind=trace.SpanKind.SERVER,
                attributes={"bc.node.id": request.node_id, "bc.gateway.id": self.gateway_id},
            )
            with tracing.active(span, end=True):  # error.type on a failure
                try:
                    welcome = await self._hello(request, stream, opening)
                except Refused as refused:  # error.type: the status code it answers
                    tracing.failed(span, refused.code.value, refused.reason)
                    span.set_attribute("bc.refusal.reason", refused.reason)
                    raise
                span.set_attribute("bc.session.epoch", welcome.epoch)
                return welcome
        except BaseException:  # no session opened: what waited for it is stale
            if self.opening.get(request.node_id) is opening:
                del self.opening[request.node_id]
            raise
        finally:
            self.pending_hellos -= 1
            self._hellos_ended.note(self.clock())

    async def _hello(
        self, request: HelloRequest, stream: DaemonStream, opening: Opening
    ) -> Welcome:
        assert self.lease_epoch is not None
        async with self.pool.acquire() as conn:
            rows = await store.read_for_admission(conn, self.gateway_id, request)
            refusal = admit(request, rows.cert, rows.node_generation, rows.now, rows.node_role)
            if refusal is not None:
                raise Refused(refusal.code, refusal.reason)
            upgrade = upgrade_required(request.daemon_version, self.settings.min_daemon_version)
            cert = rows.cert  # None: a serial with no record (no kind restriction, no expiry)
            kinds = cert.allowed_kinds if cert is not None else None
            generation = cert.identity_generation if cert is not None else None
            # the fact is checked before the epoch is bumped: no epoch without its fact
            try:
                self.facts.hello(request, store.PLACEHOLDER, upgrade, kinds, generation)
            except ValidationError as invalid:
                error = invalid.errors()[0]
                where = ".".join(str(part) for part in error["loc"])
                raise Refused(Code.INVALID_ARGUMENT, f"{where}: {error['msg']}") from None
            fact_id = uuid.uuid4()
            try:
                opened = await store.open_session(
                    conn,
                    self.gateway_id,
                    self.lease_epoch,
                    request,
                    upgrade,
                    self.settings.live_window,
                    tracing.traceparent(context.get_current()),  # dispatch continues it
                    fact_id,  # the one Hello fact of the epoch
                )
            except store.LeaseGone as gone:
                self._stopping.set()
                raise Refused(Code.UNAVAILABLE, str(gone)) from gone
            except store.NotJoined as missing:
                raise Refused(Code.PERMISSION_DENIED, str(missing)) from missing
            except store.Revoked as refused:
                raise Refused(Code.UNAUTHENTICATED, str(refused)) from refused
            except store.Unproven as unproven:  # a proof given: sign again in server time
                at, challenge = (
                    (None, None)
                    if request.proof is None
                    else (await store.hello_challenge(conn, self.gateway_id, request.node_id))
                )
                raise Refused(
                    Code.UNAUTHENTICATED, str(unproven), server_time=at, challenge=challenge
                ) from unproven
            except (store.Draining, store.Busy, store.TooMany) as later:  # the minute's
                wait = 30.0 if isinstance(later, store.TooMany) else 1.0  # Hellos age out
                raise Refused(Code.UNAVAILABLE, str(later), retry_after=pushback(wait)) from later
            # the node's spec, now that its session is this gateway's (never before: 0057),
            # read in the Hello transaction's call (0063), or after it (an older schema)
            spec = opened.desired
            if not upgrade and not opened.desired_read:
                spec = await store.desired_state(
                    conn, self.gateway_id, request.node_id, opened.epoch
                )
        opening.epoch = opened.epoch  # its notices may come from now on: they wait
        await self._paused("committed", request.node_id, opened.epoch)
        hello = self.facts.hello(request, opened, upgrade, kinds, generation, fact_id)
        older = self.sessions.get(request.node_id)
        if older is not None:  # the same node again on this gateway: the old stream is superseded
            await self._end(older, "superseded")
        self.sessions[request.node_id] = Session(
            request.node_id,
            opened.epoch,
            opened.session_id,
            request.cert_serial,
            stream,
            self.clock(),
            cert.not_after.timestamp() if cert is not None else float("inf"),
            inventory=dict(opened.inventory),
            requested=set(sections_to_request(request.inventory_hashes, opened.inventory)),
            reported=dict(request.inventory_hashes),
            hello=hello,
        )
        await self._paused("registered", request.node_id, opened.epoch)
        close = functools.partial(store.close_session, self.pool, self.gateway_id, self.lease_epoch)
        await publish_hello(self.facts, self.sessions, close, hello)
        if opened.duplicate:
            await self._verdict(request.node_id, opened.epoch)
        acked = [r.command_id for r in hello.results]
        desired = desired_state_due(spec, request, upgrade)
        release = functools.partial(self.notices.release, request.node_id, opening)
        self._spawn(follow_welcome(stream, acked, desired, release), "welcome")
        return Welcome(
            opened.epoch,
            opened.session_id,
            upgrade,
            server_time=self.wall(),
            acked_event_seq=opened.acked_event_seq,
            credits=self.settings.credits,
            request_sections=sections_to_request(request.inventory_hashes, opened.inventory),
        )

    async def _verdict(self, node_id: str, epoch: int) -> None:
        """A duplicate identity's Hello waits, `verdict_wait` at most, for what the
        quarantine makes of it. Revoked: its session ends (`revoked`) and the Hello is
        refused UNAUTHENTICATED, as the seed has it. Otherwise it is welcomed — held until
        the quarantine counts it, as the hold bound rules when the quarantine is down."""
        deadline = time.monotonic() + self.settings.verdict_wait
        while True:
            async with self.pool.acquire() as conn:
                verdict = await store.hello_verdict(conn, self.gateway_id, node_id, epoch)
            if verdict == "revoked":
                session = self.sessions.get(node_id)
                if session is not None and session.epoch == epoch:
                    await self._end(session, "revoked")
                raise Refused(Code.UNAUTHENTICATED, QUARANTINED)
            if verdict != "held" or time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.05)

    async def _paused(self, point: str, node_id: str, epoch: int) -> None:
        if self.pause is not None:
            await self.pause(point, node_id, epoch)

    # -- periodic work -------------------------------------------------------------------
    async def tick(self) -> None:
        """Renew the lease, flush last-seen, time out silent sessions (whatever is due)."""
        if not self.alive:
            return
        now = self.clock()
        if now - self._renewed_at >= self.settings.renew_every:
            try:
                async with self._leases.acquire() as conn:
                    await store.renew(
                        conn,
                        self.gateway_id,
                        self.lease_epoch or 0,
                        timedelta(seconds=self.settings.lease_ttl),
                    )
                self._renewed_at = now
            except store.LeaseGone:
                log.warning(
                    "gateway %s lost its lease: refusing Hellos, dropping streams", self.gateway_id
                )
                await self.stop(graceful=False)
                return
        timeout = self.settings.heartbeat_interval * self.settings.missed_heartbeats
        for session in [s for s in self.sessions.values() if now - s.last_seen > timeout]:
            await self._end(session, "heartbeat-timeout")
        wall = self.wall()  # once a tick: not once a session
        for session in [s for s in self.sessions.values() if s.cert_not_after <= wall]:
            await self._end(session, "certificate-expired")
        if now - self._flushed_at >= self.settings.flush_period:
            self._flushed_at = now
            # beside the tick, not in it: a flush waits on the bus, and a bus that is away
            # must not stop the lease from being renewed (the lease lives in PostgreSQL)
            if self._flushing is None or self._flushing.done():
                self._flushing = asyncio.create_task(self._flush_logged())

    async def _flush_logged(self) -> None:
        try:
            await self.flush()
        except Exception as error:  # the next period's flush carries newer ages anyway
            log.warning("gateway %s: flush not published (%r)", self.gateway_id, error)

    async def flush(self) -> None:
        """The liveness fact: every session's age, in facts of at most 256 KiB of entries.

        Published every flush period even with no session, and at the first tick after
        `start()`: an empty flush is the gateway's heartbeat on the bus, by which the
        liveness controller knows it can see this gateway (and so may age its sessions).
        """
        self._flushed_at = self.clock()
        await self.facts.flush(list(self.sessions.values()), self._flushed_at)
