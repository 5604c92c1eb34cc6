"""What a reference gateway shows its daemons and its owner: the refusal, the Welcome, the
stream protocol a daemon implements, the settings, and the handshake token bucket."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol
from uuid import UUID

from opentelemetry.context import Context

from schemas.facts import Hello, NodeLoad, node_hash
from schemas.notices import Dispatch
from workers.gateway.admission import Code, DesiredState


class Refused(Exception):
    """A refused Hello: the gRPC-style code, why, and (pushback) when to retry. A Hello
    whose proof did not hold also carries the database's time (Unix seconds, as a
    Welcome's `server_time`: not signed) and a challenge the database issued for that node,
    this gateway and that time: a daemon whose clock is wrong signs its next Hello with them
    (docs/contract.md, "The Hello's proof")."""

    def __init__(
        self,
        code: Code,
        reason: str,
        retry_after: float | None = None,
        server_time: float | None = None,
        challenge: str | None = None,
    ) -> None:
        super().__init__(f"{code.value}: {reason}")
        self.code = code
        self.reason = reason
        self.retry_after = retry_after
        self.server_time = server_time
        self.challenge = challenge


class DaemonStream(Protocol):
    """The gateway's side of a daemon's stream."""

    async def deliver(self, dispatch: Dispatch) -> None: ...

    async def event_ack(self, journal_id: str, seq: int) -> None: ...

    async def ack_results(self, command_ids: Sequence[UUID]) -> None:
        """The results the Hello carried are stored: the daemon may forget them."""

    async def desired_state(self, desired: DesiredState) -> None:
        """The node's full desired state (right after the Welcome, before the replay)."""

    def drop(self, reason: str, code: str) -> None:
        """The gateway ends the stream: with this status code (`CLOSE_CODES`) and reason."""


@dataclass
class Session:
    """One daemon's live session on this gateway, as the gateway keeps it in memory."""

    node_id: str
    epoch: int
    session_id: str
    cert_serial: str
    stream: DaemonStream
    last_seen: float  # clock seconds
    cert_not_after: float = float("inf")  # wall seconds: the session ends then
    credits: dict[str, int] | None = None  # free per lane, from the last heartbeat with them
    load: float | None = None  # from the last heartbeat with it: its load average
    node_load: NodeLoad | None = None  # the whole NodeLoad of that heartbeat
    inventory: dict[str, str] = field(default_factory=dict)  # section → hash the store holds
    requested: set[str] = field(default_factory=set)  # sections asked for and not yet sent
    reported: dict[str, str] = field(default_factory=dict)  # the hashes last reported
    #: section → (hash, body) sent and not yet applied: the inventory is applied whole,
    #: once it agrees with `reported`
    held_sections: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    applied_generation: int = 0  # the highest its heartbeats reported
    reported_generation: int = 0  # the highest published in a status fact
    hello: Hello | None = None  # the fact published for it, kept to publish again if asked
    #: its place in the hash space its gateway's flushes are cut by (`node_hash`)
    hash: int = field(init=False)

    def __post_init__(self) -> None:
        self.hash = node_hash(self.node_id)

    @property
    def held_hashes(self) -> dict[str, str]:
        """section → hash of what is held and not yet applied."""
        return {section: digest for section, (digest, _) in self.held_sections.items()}


@dataclass
class Opening:
    """A Hello of one node under way on this gateway. The workers may send notices for the
    epoch it opens as soon as its transaction commits — before the gateway has registered
    the session, before the daemon has its Welcome. They wait here, and go out after the
    Welcome and what follows it (`Notices.release`): never dropped, never acked away."""

    epoch: int | None = None  # known once the Hello transaction committed
    #: (notice, the trace context it arrived in), in arrival order
    held: list[tuple[object, Context]] = field(default_factory=list)


@dataclass(frozen=True)
class HeartbeatAck:
    """The gateway's answer to a heartbeat."""

    #: the gateway's wall clock: the daemon moves its server-time mark forward with it
    server_time: float
    #: the inventory sections whose hash the control plane does not hold: send them
    request_sections: tuple[str, ...] = ()


@dataclass(frozen=True)
class Welcome:
    epoch: int
    session_id: str
    upgrade_required: bool
    #: the gateway's clock when it welcomed (the daemon keeps the latest as its mark: a
    #: Welcome more than 5 minutes behind it ends the session)
    server_time: float = 0.0
    #: the last event seq the control plane holds of the daemon's journal (re-send after it)
    acked_event_seq: int = 0
    #: commands the daemon may hold per lane
    credits: int = 8
    #: the inventory sections whose hash the control plane does not hold: send them
    request_sections: tuple[str, ...] = ()


@dataclass(frozen=True)
class GatewaySettings:
    heartbeat_interval: float = 10.0
    missed_heartbeats: int = 3
    flush_period: float = 15.0
    lease_ttl: float = 15.0
    renew_every: float = 5.0
    #: one bucket for every Hello of this gateway (the real gateway shares it with Join,
    #: which this core does not serve)
    handshakes_per_second: float = 200.0
    max_streams: int = 5_000
    max_pending_hellos: int = 64
    min_daemon_version: str = "0"
    credits: int = 8  # per lane, told to each daemon in its Welcome
    #: how long a duplicate identity's Hello waits for the quarantine's verdict before it
    #: is welcomed held (revoked meanwhile: refused UNAUTHENTICATED)
    verdict_wait: float = 3.0

    @property
    def live_window(self) -> timedelta:
        return timedelta(seconds=self.heartbeat_interval * self.missed_heartbeats)


class TokenBucket:
    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.tokens = rate
        self.clock = clock
        self.stamp = clock()

    def take(self) -> float:
        """0 if a token was taken; else seconds until one is there."""
        now = self.clock()
        self.tokens = min(self.rate, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate
