"""Facts: what a gateway saw, published on `<root>.facts.<gateway_id>.<type>`.

Consumed by the workers; produced by gateways (and the reference gateway in `workers`).
Snake_case field names, as in the session protocol. Pure data: no I/O here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal, NotRequired, Protocol, TypeVar
from uuid import UUID

from pydantic import AwareDatetime, ConfigDict, Field, model_validator, with_config
from typing_extensions import TypedDict

from schemas.base import GatewayId, Ident, Name, NodeId, Sha256Hex, SnakeMessage
from schemas.proof import HelloProof

#: Integers are bounded by what PostgreSQL stores (bigint, or integer where the column is
#: one), so an out-of-range value is refused as invalid instead of failing in SQL.
BIGINT_MAX = 2**63 - 1
INTEGER_MAX = 2**31 - 1
#: ages of at most ~31 years: `compute_now() - age` stays inside PostgreSQL's date range
AGE_MS_MAX = 10**12
NonNegative = Annotated[int, Field(ge=0, le=BIGINT_MAX)]
Positive = Annotated[int, Field(ge=1, le=BIGINT_MAX)]
SmallNonNegative = Annotated[int, Field(ge=0, le=INTEGER_MAX)]
SmallPositive = Annotated[int, Field(ge=1, le=INTEGER_MAX)]

#: Upper bounds on lists, so a malformed fact is refused instead of exhausting memory.
MAX_LIVENESS_ENTRIES = 10_000
MAX_RUNNING_COMMANDS = 4_096
MAX_EVENTS_PER_FACT = 1_000
MAX_INVENTORY_SECTIONS = 256
MAX_HELLO_RESULTS = 1_024

CloseReason = Literal[
    "stream-closed",
    "heartbeat-timeout",
    "certificate-expired",
    "revoked",
    "protocol-error",
    "gateway-shutdown",
    "superseded",
    "fenced",
]
#: the status code a stream ends with, by close reason (gRPC codes; `CANCELLED`: the
#: daemon closed it)
CloseCode = Literal["CANCELLED", "ABORTED", "UNAVAILABLE", "UNAUTHENTICATED", "INVALID_ARGUMENT"]
CLOSE_CODES: dict[str, CloseCode] = {
    "stream-closed": "CANCELLED",
    "heartbeat-timeout": "UNAVAILABLE",
    "certificate-expired": "UNAUTHENTICATED",
    "revoked": "UNAUTHENTICATED",
    "protocol-error": "INVALID_ARGUMENT",
    "gateway-shutdown": "UNAVAILABLE",
    "superseded": "ABORTED",
    "fenced": "ABORTED",
}
#: close reasons of a session that no longer owns its row (a newer session does): its close
#: writes nothing; every other close is written, fenced, by its gateway and the liveness worker
ROW_OF_ANOTHER: frozenset[str] = frozenset({"superseded", "fenced"})


class Fact(SnakeMessage):
    """Fields every fact carries. `fact_id` equals the message's `Nats-Msg-Id`."""

    fact_id: UUID
    gateway_id: GatewayId
    observed_at: AwareDatetime


class NodeFact(Fact):
    node_id: NodeId


class CertInfo(SnakeMessage):
    serial: Ident | None = None
    allowed_kinds: list[Name] | None = Field(default=None, max_length=256)
    identity_generation: SmallNonNegative | None = None


class PreviousSession(SnakeMessage):
    """The `node_sessions` row as it was before the Hello bumped the epoch."""

    epoch: NonNegative
    gateway_id: GatewayId | None = None
    boot_id: Ident | None = None
    journal_id: Ident | None = None
    live: bool = False


class DoneResult(SnakeMessage):
    """A result the daemon holds and the control plane has not acked yet (it finished
    while the node was away), carried by the Hello: as in a `result` fact."""

    command_id: UUID
    outcome: Literal["done", "failed"]
    result: dict[str, Any] | None = None
    error: Annotated[str, Field(max_length=4096)] | None = None


#: a capability name the labeler keeps (and the Hello transaction stores)
CAPABILITY_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
MAX_CAPABILITIES = 64


def sanitize(advertised: Iterable[object]) -> tuple[str, ...]:
    """Valid names only, de-duplicated, sorted, at most 64. Never raises, whatever it is given.

    Pure. Invalid entries (wrong characters, too long, not strings) are dropped, not
    fatal; the 65th name and after (in sorted order) are not kept. The Hello transaction
    stores them as the session's capabilities; the labeler labels them.
    """
    valid = {name for name in advertised if isinstance(name, str) and CAPABILITY_RE.fullmatch(name)}
    return tuple(sorted(valid))[:MAX_CAPABILITIES]


class Hello(NodeFact):
    BC_TYPE = "hello"
    NEVER_STORED = frozenset({"capabilities"})  # the labeler keeps the valid names only

    session_id: Ident
    epoch: Positive
    role: Name
    boot_id: Ident
    journal_id: Ident
    daemon_version: Name
    proto_max: SmallNonNegative
    trust_version: NonNegative
    #: raw, as the daemon sent them: never a reason to refuse the Hello (any list the bus
    #: can carry; the labeler keeps the valid names, at most 64)
    capabilities: list[str]
    approver_set_epoch: NonNegative | None = None
    approver_set_sha256: Sha256Hex | None = None
    running_command_ids: list[UUID] = Field(max_length=MAX_RUNNING_COMMANDS)
    inventory_hashes: dict[Name, Name] = Field(max_length=MAX_INVENTORY_SECTIONS)
    cert: CertInfo
    upgrade_required: bool
    transport: Literal["grpc", "websocket"]
    previous: PreviousSession
    #: when the daemon's process started (optional): the proof that a restart happened
    process_started_at: AwareDatetime | None = None
    #: the daemon's done results not acked yet (optional): they settle before the replay
    results: list[DoneResult] = Field(default_factory=list, max_length=MAX_HELLO_RESULTS)
    #: the Hello transaction's judgement (optional; gateways of 0.4 and later say it and
    #: leave `previous`'s boot, journal and gateway out, which they are no longer told):
    #: the previous session was live, from another boot. What a worker acts on is what the
    #: transaction recorded under the node's lock (`session_epochs`), not this claim.
    duplicate: bool | None = None
    #: whether the Hello transaction took the daemon's proof (optional; None: not checked)
    proven: bool | None = None
    #: the daemon's proof, as it sent it (optional; checked by the Hello transaction)
    proof: HelloProof | None = None

    @property
    def journal_changed(self) -> bool:
        """The previous session had a journal, and it is not this one."""
        return self.previous.journal_id is not None and self.previous.journal_id != self.journal_id

    @property
    def boot_changed(self) -> bool:
        """The previous session had a boot id, and it is not this one."""
        return self.previous.boot_id is not None and self.previous.boot_id != self.boot_id

    @property
    def duplicate_identity(self) -> bool:
        """The previous session was live, from another boot: two machines share one identity
        (as the Hello transaction judged it, where it said)."""
        if self.duplicate is not None:
            return self.duplicate
        return is_duplicate_identity(self.previous.live, self.previous.boot_id, self.boot_id)


def is_duplicate_identity(previous_live: bool, previous_boot_id: str | None, boot_id: str) -> bool:
    """Two machines share one identity: the previous session was live, from another boot.
    The one rule, for the Hello fact and for the Hello transaction that holds such a
    session for the quarantine."""
    return previous_live and previous_boot_id is not None and previous_boot_id != boot_id


#: an entry of a flush is a plain dict, not a model: a liveness replica validates a
#: million nodes' entries every 15 s, and a model per entry and per heartbeat load cost
#: it about three times what the dicts do (docs/benchmarks.md, "bcw bench flush").
#: Validated as strictly as a message, unknown keys dropped alike.
_ENTRY = ConfigDict(strict=True, extra="ignore")
#: what the schema says of an optional field of an entry, as of a model's field
_ABSENT_IS_NONE = Field(json_schema_extra={"default": None})
#: a node's load average, as its heartbeat says it
LoadAverage = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]


@with_config(_ENTRY)
class NodeLoad(TypedDict):
    """What a daemon's heartbeat says of its node's load."""

    load_average: LoadAverage
    memory_available_bytes: Annotated[int, Field(ge=0, le=2**63 - 1)]
    running_commands: SmallNonNegative
    pending_events: SmallNonNegative  # journal events not acked yet


@with_config(_ENTRY)
class LivenessEntry(TypedDict):
    # one session of a flush (a dict: `entry["node_id"]`; an optional field is absent or
    # None alike, `entry.get("credits")`); no docstring: it would enter the JSON Schema
    node_id: NodeId
    epoch: Positive
    age_ms: Annotated[int, Field(ge=0, le=AGE_MS_MAX)]
    #: the daemon's free credits per lane at its last heartbeat (optional: a flush without
    #: them keeps the last known ones)
    credits: NotRequired[
        Annotated[dict[Name, SmallNonNegative] | None, Field(max_length=64), _ABSENT_IS_NONE]
    ]
    #: the daemon's load at its last heartbeat (optional, like `credits`): its load average
    load: NotRequired[Annotated[LoadAverage | None, _ABSENT_IS_NONE]]
    #: the whole NodeLoad of its last heartbeat (optional; `load` is its load average)
    node_load: NotRequired[Annotated[NodeLoad | None, _ABSENT_IS_NONE]]


#: node hashes are 32-bit: a range of them is `[range_start, range_end)` within `[0, 2**32)`
HASH_SPACE = 2**32
RangeStart = Annotated[int, Field(ge=0, lt=HASH_SPACE)]
RangeEnd = Annotated[int, Field(ge=1, le=HASH_SPACE)]


def node_hash(node_id: str) -> int:
    """A node's place in the hash space a flush is cut by: the first 4 bytes of the MD5
    of its id (UTF-8), big-endian — what PostgreSQL's `node_hash(text)` computes (migration
    0037; a test holds them equal). Not a security measure: it only spreads nodes. Pure."""
    return int.from_bytes(hashlib.md5(node_id.encode(), usedforsecurity=False).digest()[:4], "big")


class Liveness(Fact):
    BC_TYPE = "liveness"

    entries: list[LivenessEntry] = Field(max_length=MAX_LIVENESS_ENTRIES)
    #: the range of node hashes (`node_hash`) the fact covers, `[range_start, range_end)`:
    #: when it names one, the fact is the gateway's whole set of sessions in it — a session
    #: of that range it does not name, the gateway no longer holds (optional, both or
    #: neither, since 0.4: a fact without them says nothing of the sessions it omits)
    range_start: RangeStart | None = None
    range_end: RangeEnd | None = None

    @model_validator(mode="after")
    def _a_range_or_none(self) -> Liveness:
        if (self.range_start is None) != (self.range_end is None):
            raise ValueError("range_start and range_end come together, or neither")
        start, end = self.range_start, self.range_end
        if start is not None and end is not None and start >= end:
            raise ValueError("range_start must be below range_end")
        return self


class Closed(NodeFact):
    BC_TYPE = "closed"

    epoch: Positive
    reason: CloseReason
    #: the status code the stream ended with (optional: older gateways do not say)
    code: CloseCode | None = None


class Progress(NodeFact):
    BC_TYPE = "progress"

    epoch: Positive
    command_id: UUID
    state: Literal["acked", "running"]


class Result(NodeFact):
    BC_TYPE = "result"

    epoch: Positive
    command_id: UUID
    outcome: Literal["done", "failed"]
    result: dict[str, Any] | None = None
    error: Annotated[str, Field(max_length=4096)] | None = None


class Rejected(NodeFact):
    BC_TYPE = "rejected"

    epoch: Positive
    command_id: UUID
    reason: Literal["BUSY"]


class NodeEvent(SnakeMessage):
    seq: Positive
    kind: Name
    body: dict[str, Any]
    at: AwareDatetime


class Events(NodeFact):
    BC_TYPE = "events"

    journal_id: Ident
    events: list[NodeEvent] = Field(min_length=1, max_length=MAX_EVENTS_PER_FACT)


class Status(NodeFact):
    BC_TYPE = "status"

    epoch: Positive
    observed_generation: NonNegative
    trust_version: NonNegative
    approver_set_epoch: NonNegative | None = None
    approver_set_sha256: Sha256Hex | None = None


FACT_TYPES: tuple[type[Fact], ...] = (
    Hello,
    Liveness,
    Closed,
    Progress,
    Result,
    Rejected,
    Events,
    Status,
)


class _EpochFact(Protocol):
    @property
    def node_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...


E = TypeVar("E", bound=_EpochFact)


def newest_per_node(facts: Iterable[E]) -> dict[str, E]:
    """Each node's fact of the highest epoch (a later one wins a tie): only that one can
    match the node's current row. Pure; used by the workers to fold a batch."""
    newest: dict[str, E] = {}
    for fact in facts:
        seen = newest.get(fact.node_id)
        if seen is None or fact.epoch >= seen.epoch:
            newest[fact.node_id] = fact
    return newest
