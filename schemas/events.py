"""Events: what the workers tell subscribers, on `<root>.events.<type>` and `<root>.revocations`.

Produced by the workers through the outbox; read by operators' subscribers.
camelCase on the wire, snake_case in Python. Pure data: no I/O here.
"""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, Field

from schemas.base import CamelMessage, GatewayId, Ident, Name, NodeId
from schemas.facts import CloseCode, CloseReason, NonNegative, SmallNonNegative

DisconnectReason = CloseReason | Literal["liveness-timeout", "gateway-lost"]
#: when the event's fact happened (since 0.4; absent from a worker before it, so a reader
#: takes both): when the fact it comes of happened (its gateway's `observed_at`, never later
#: than the facts stream stored it; not the time a worker applied it), or, for what no fact
#: says (a sweep's timeout, a gateway gone blind, a hold's end), when the worker decided
#: it; on the database's clock.
#: docs/contract.md, "When it happened".
FactTime = AwareDatetime | None


class NodeConnected(CamelMessage):
    BC_TYPE = "node.connected"

    node_id: NodeId
    epoch: NonNegative
    gateway_id: GatewayId
    boot_id: Ident
    journal_changed: bool
    boot_changed: bool
    duplicate_identity: bool
    #: when its Hello happened (`FactTime`)
    connected_at: FactTime = None


class NodeDisconnected(CamelMessage):
    BC_TYPE = "node.disconnected"

    node_id: NodeId
    epoch: NonNegative
    gateway_id: GatewayId | None
    reason: DisconnectReason
    #: the status code its stream ended with (None: no stream end was seen, e.g. a sweep)
    code: CloseCode | None = None
    #: when its stream ended, or the sweep decided it (`FactTime`)
    disconnected_at: FactTime = None


class CapabilitiesChanged(CamelMessage):
    BC_TYPE = "node.capabilities-changed"

    node_id: NodeId
    epoch: NonNegative
    added: list[Name] = Field(max_length=64)
    removed: list[Name] = Field(max_length=1024)
    at: FactTime = None


class DuplicateSession(CamelMessage):
    BC_TYPE = "security.node.duplicate-session"

    node_id: NodeId
    gateway_id: GatewayId
    previous_boot_id: Ident | None
    boot_id: Ident
    alternations: SmallNonNegative
    window_seconds: SmallNonNegative
    quarantined: bool
    #: whether the node is held for an operator after this one (a quarantine the breaker
    #: holds: no session of the node gets a command until it is released or dismissed);
    #: None from a worker before 0.4
    held: bool | None = None
    at: FactTime = None


class UnprovenHello(CamelMessage):
    """A Hello without a proof for a node that proves its Hellos (it enrolled a Hello key):
    a takeover attempt by the gateway that said it. Its session is held for good: no
    command, label or revocation comes of it; the node's own proven Hello takes it back."""

    BC_TYPE = "security.node.unproven-hello"

    node_id: NodeId
    gateway_id: GatewayId
    epoch: NonNegative
    boot_id: Ident
    serial: Ident | None = None  # the certificate serial it presented
    at: FactTime = None


class Quarantined(CamelMessage):
    BC_TYPE = "security.node.quarantined"

    node_id: NodeId
    reason: Name
    alternations: SmallNonNegative
    revoked_serials: list[Ident] = Field(max_length=1024)
    at: FactTime = None


class QuarantineHeld(CamelMessage):
    """A quarantine whose revocation waits for an operator (`bcw quarantine release`): every
    alternation came through one gateway (`one-gateway`), or its gateway or the fleet
    revoked as many as the breaker allows (`breaker`). Its session stays held."""

    BC_TYPE = "security.quarantine.held"

    node_id: NodeId
    gateway_id: GatewayId
    reason: Literal["one-gateway", "breaker"]
    alternations: SmallNonNegative
    gateways: list[GatewayId] = Field(max_length=1024)
    serials: list[Ident] = Field(max_length=1024)
    at: FactTime = None


class QuarantineBreakerOpen(CamelMessage):
    """One gateway's Hellos (or the fleet's) led to as many revocations as the breaker
    allows in its window: further ones are held for an operator."""

    BC_TYPE = "security.quarantine.breaker-open"

    gateway_id: GatewayId
    revoked: SmallNonNegative  # revocations made at once in the window, this gateway's
    window_seconds: SmallNonNegative
    at: FactTime = None


class HoldExpired(CamelMessage):
    """A session held for the quarantine (its Hello a duplicate identity, not yet counted)
    was released after `BCW_QUARANTINE_HOLD_MAX`: it gets its commands from now on."""

    BC_TYPE = "security.node.hold-expired"

    node_id: NodeId
    epoch: NonNegative
    gateway_id: GatewayId | None
    held_seconds: Annotated[float, Field(ge=0)]
    at: FactTime = None


class CommandEvent(CamelMessage):
    """Fields shared by the four command events."""

    command_id: UUID
    node_id: NodeId
    epoch: NonNegative
    seq: NonNegative
    kind: Name
    attempt: SmallNonNegative
    reason: Annotated[str, Field(max_length=1024)] | None = None
    at: FactTime = None


class CommandReplayed(CommandEvent):
    BC_TYPE = "command.replayed"


class CommandCancelled(CommandEvent):
    BC_TYPE = "command.cancelled"


class CommandFailed(CommandEvent):
    BC_TYPE = "command.failed"


class CommandCompleted(CommandEvent):
    BC_TYPE = "command.completed"


class GatewaySight(CamelMessage):
    """The liveness controller's sight of one gateway changed (said once per transition)."""

    gateway_id: GatewayId
    sessions: NonNegative  # sessions routed to the gateway
    last_flush_age_seconds: Annotated[float, Field(ge=0)] | None  # None: it never flushed
    at: FactTime = None


class GatewayBlind(GatewaySight):
    """What the controller applied of the gateway's flushes does not cover it lately: its
    sessions are held, not aged."""

    BC_TYPE = "gateway.blind"

    #: why (absent from a release before 0.4): `lag`, the controller's own consumer holds
    #: flushes stored before the blind threshold; `no-flush`, none reaches it
    reason: Literal["lag", "no-flush"] | None = None


class GatewaySeeing(GatewaySight):
    """Flushes of the gateway are applied again: its sessions age again."""

    BC_TYPE = "gateway.seeing"


class BreakerOpen(CamelMessage):
    """A sweep would have disconnected too many of one gateway's sessions at once: none was."""

    BC_TYPE = "liveness.breaker-open"

    gateway_id: GatewayId
    would_disconnect: NonNegative
    connected: NonNegative
    at: FactTime = None


class Revocations(CamelMessage):
    """Broadcast on `<root>.revocations` to every gateway: drop these serials."""

    BC_TYPE = "revocations"

    node_id: NodeId
    serials: list[Ident] = Field(max_length=1024)
    reason: Name
    at: FactTime = None


EVENT_TYPES: tuple[type[CamelMessage], ...] = (
    NodeConnected,
    HoldExpired,
    NodeDisconnected,
    CapabilitiesChanged,
    DuplicateSession,
    UnprovenHello,
    Quarantined,
    QuarantineHeld,
    QuarantineBreakerOpen,
    CommandReplayed,
    CommandCancelled,
    CommandFailed,
    CommandCompleted,
    GatewayBlind,
    GatewaySeeing,
    BreakerOpen,
    Revocations,
)
