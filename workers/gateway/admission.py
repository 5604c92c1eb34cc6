"""The reference gateway's admission of a Hello, pure: no await, no clock, no I/O.

Given what the daemon presented and the rows the gateway read (the certificate by
serial, the node), say whether the Hello is admitted or refused with which code.
Applied by `workers.gateway.gateway.Gateway.hello`.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from schemas.proof import HelloProof


class Code(enum.Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # pushback: retry after a jittered delay
    UNAVAILABLE = "UNAVAILABLE"  # this gateway's lease is gone: try another


@dataclass(frozen=True)
class HelloRequest:
    """What a daemon sends to open its session."""

    node_id: str
    cert_serial: str
    role: str
    boot_id: str
    journal_id: str
    #: the node id the transport read from the certificate (its SPIFFE ID's last path
    #: segment); None only where no transport verified one (a library caller's test)
    cert_node_id: str | None = None
    daemon_version: str = "1.0.0"
    proto_max: int = 3
    trust_version: int = 0
    capabilities: Sequence[str] = ()
    approver_set_epoch: int | None = None
    approver_set_sha256: str | None = None
    running_command_ids: Sequence[str] = ()
    inventory_hashes: dict[str, str] = field(default_factory=dict)
    transport: str = "grpc"
    process_started_at: datetime | None = None  # the daemon process's start (optional)
    #: its done results not acked yet: `{command_id, outcome, result, error}` each
    results: Sequence[Mapping[str, Any]] = ()
    applied_generation: int = 0  # the desired-state generation it applied
    spec_hash: str | None = None  # the hash of the spec it applied (None: it has none)
    #: its proof that it holds the node's key (None: a daemon that does not sign)
    proof: HelloProof | None = None


@dataclass(frozen=True)
class DesiredState:
    """The node's spec as the control plane wants it, sent whole: `body`, the exact bytes
    stored (those its `signature` covers, relayed verbatim), and `spec`, their JSON."""

    generation: int
    spec: Mapping[str, Any]
    signature: str | None = None
    body: str = ""


def desired_state_due(
    desired: DesiredState | None, request: HelloRequest, upgrade_only: bool
) -> DesiredState | None:
    """What follows the Welcome: the full desired state when the daemon is behind it (its
    applied generation is lower, or it reports no spec hash while the node has a spec);
    never to an upgrade-only session; to a WebSocket session only when signed. Pure."""
    if desired is None or upgrade_only:
        return None
    if request.transport == "websocket" and not desired.signature:
        return None
    if desired.generation > request.applied_generation or request.spec_hash is None:
        return desired
    return None


@dataclass(frozen=True)
class CertRow:
    serial: str
    node_id: str
    identity_generation: int
    role: str
    not_after: datetime
    revoked: bool
    allowed_kinds: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Refusal:
    code: Code
    reason: str


def pushback(base: float, draw: Callable[[], float] = random.random) -> float:
    """When a refused Hello may come back: in [base, 2·base), jittered by `draw` (in
    [0, 1)) so that a herd spreads out instead of coming back at once. Pure but for
    `draw`."""
    return base * (1.0 + draw())


#: the seed's pushback for a refusal at maxPendingHellos, the least it is; and the most
BUSY_PUSHBACK_MIN = 0.2
BUSY_PUSHBACK_MAX = 15.0
#: seconds of Hello transactions' ends a gateway counts to know its Hello rate
RATE_WINDOW = 5.0


def busy_pushback(pending: int, ended_per_second: float) -> float:
    """The base of the pushback (before `pushback`'s jitter) of a Hello refused because
    `pending` Hello transactions are under way: about when they will have ended, at the
    rate Hello transactions ended lately — never less than BUSY_PUSHBACK_MIN (the refusal's
    fixed pushback before), nor more than BUSY_PUSHBACK_MAX; RATE_WINDOW when none ended
    lately (the database is slow: no sooner than the rate can be told). A fixed 0.2 s had
    a rollout's daemons refused 29 times a session moved (20,000 nodes on 5 gateways; 22
    with this), each refusal a stream opened and dropped. Pure."""
    if ended_per_second <= 0.0:
        return RATE_WINDOW
    return min(BUSY_PUSHBACK_MAX, max(BUSY_PUSHBACK_MIN, pending / ended_per_second))


class RateMeter:
    """Events a second over the last RATE_WINDOW seconds, in one-second buckets (O(1) a
    note or a read). Time is given, not read: pure but for its state."""

    def __init__(self, window: float = RATE_WINDOW) -> None:
        self._size = max(1, int(window))
        self._counts = [0] * self._size
        self._seconds = [-1] * self._size

    def note(self, now: float) -> None:
        second = int(now)
        slot = second % self._size
        if self._seconds[slot] != second:
            self._seconds[slot], self._counts[slot] = second, 0
        self._counts[slot] += 1

    def per_second(self, now: float) -> float:
        """Over the window's whole seconds before `now`'s (the current one is partial)."""
        second = int(now)
        counted = sum(
            count
            for seen, count in zip(self._seconds, self._counts, strict=True)
            if second - self._size <= seen < second
        )
        return counted / self._size


def admit(
    request: HelloRequest,
    cert: CertRow | None,
    node_generation: int | None,
    now: datetime,
    node_role: str | None = None,
) -> Refusal | None:
    """None if the Hello may open a session; else why not. Pure.

    The certificate's own node id (`cert_node_id`, from its SPIFFE ID) must be the node's,
    for every serial, recorded or not. `node_generation` and `node_role` are the node's,
    None when it never joined. `cert`
    is the presented serial's record, None when none is recorded: such a certificate was
    verified by the transport and is admitted (only a recorded revocation, expiry or older
    generation refuses one); its session has no kind restriction and no expiry of record,
    and its role must be the node's.
    """
    if not request.boot_id or not request.journal_id:
        return Refusal(Code.INVALID_ARGUMENT, "boot_id and journal_id must be set")
    if (request.approver_set_epoch is None) != (not request.approver_set_sha256):
        return Refusal(
            Code.INVALID_ARGUMENT, "approver_set_epoch and approver_set_sha256 go together"
        )
    if request.cert_node_id is not None and request.cert_node_id != request.node_id:
        # whatever the serial's record says, or if it has none
        return Refusal(Code.PERMISSION_DENIED, "the certificate names another node")
    if node_generation is None:
        return Refusal(Code.PERMISSION_DENIED, f"node {request.node_id} never joined")
    if cert is None:
        if not request.role or (node_role is not None and request.role != node_role):
            return Refusal(Code.PERMISSION_DENIED, "role missing or not the node's")
        return None
    if cert.revoked:
        return Refusal(Code.UNAUTHENTICATED, "certificate revoked")
    if cert.not_after <= now:
        return Refusal(Code.UNAUTHENTICATED, "certificate expired")
    if cert.node_id != request.node_id:
        return Refusal(Code.PERMISSION_DENIED, "the certificate is another node's")
    if cert.identity_generation < node_generation:
        return Refusal(Code.UNAUTHENTICATED, "certificate of an older identity generation")
    if not request.role or request.role != cert.role:
        return Refusal(Code.PERMISSION_DENIED, "role missing or not the certificate's")
    return None


def version_tuple(version: str) -> tuple[int, ...]:
    """`1.10.2` → (1, 10, 2); non-numeric parts count as 0. Pure."""
    parts = []
    for part in version.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def upgrade_required(daemon_version: str, minimum: str) -> bool:
    """A daemon older than the supported minimum may only be upgraded. Pure."""
    return version_tuple(daemon_version) < version_tuple(minimum)
