"""What one transaction publishes: `OutboxBatch` collects the messages (each one its
worker emits: its `grants.py`, `principals.EMITS`) and the session history they make, and writes both in
one statement, owned by the worker, in the transaction of the effects: the messages as
one row of `outbox_packs` and the history as one row of `session_history_packs`, however
many they are. The relay (`outbox.OutboxRelay`) publishes them after commit.
"""

from __future__ import annotations

import functools
import json
import os
import uuid
from dataclasses import dataclass, field

import asyncpg
from opentelemetry.context import Context

from schemas.base import Message
from schemas.registry import REGISTRY, SCHEMA_HEADER, TYPE_HEADER
from schemas.subjects import split_gateway_subject
from workers.runtime.bus.principals import EMITTED_TYPES, NotEmitted
from workers.runtime.observability import tracing

#: what a node's session history records: every event and notice about a node that a
#: worker publishes (not event-acks, revocations or the liveness controller's own events)
HISTORY_TYPES = frozenset(
    {
        "node.connected",
        "node.disconnected",
        "node.capabilities-changed",
        "security.node.duplicate-session",
        "security.node.quarantined",
        "security.node.unproven-hello",
        "command.replayed",
        "command.cancelled",
        "command.failed",
        "command.completed",
        "dispatch",
        "zombie",
    }
)


_KEEP = ~(0xC000 << 48) & ~(0xF000 << 64)
_VERSION_4 = (0x8000 << 48) | (4 << 76)


def uuid4_of(raw: bytes) -> uuid.UUID:
    """`uuid.UUID(bytes=raw, version=4)`, a third cheaper: the 16 random bytes with the
    variant and version bits set. Pure."""
    return uuid.UUID(int=int.from_bytes(raw, "big") & _KEEP | _VERSION_4)


class RandomIds:
    """Random (version 4) UUIDs, as `uuid.uuid4()` makes them, from the OS's randomness
    read `per_read` at a time: a `getrandom` call per message cost a tenth of the
    runtime's CPU per fact. Unpredictable as uuid4's (a message id decides JetStream's
    deduplication); a forked child starts afresh instead of repeating its parent's."""

    def __init__(self, per_read: int = 256) -> None:
        self._size = 16 * per_read
        self._pool = b""
        self._at = 0
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._pool, self._at = b"", 0

    def __call__(self) -> uuid.UUID:
        if self._at >= len(self._pool):
            self._pool, self._at = os.urandom(self._size), 0
        raw = self._pool[self._at : self._at + 16]
        self._at += 16
        return uuid4_of(raw)


new_msg_id = RandomIds()

HistoryRow = tuple[str, str, int | None, str | None, uuid.UUID | None, str | None, str]


@dataclass
class OutboxBatch:
    """Messages one transaction wants published, and the session history they make.
    Written by `write()` before commit, in the same transaction as the effects."""

    worker: str = ""
    rows: list[tuple[uuid.UUID, str, str, bytes, str | None]] = field(default_factory=list)
    #: (node_id, what, epoch, gateway_id, fact_id, trace_id, detail)
    history: list[HistoryRow] = field(default_factory=list)
    #: the trace context of a message added without one (a loop's round, say)
    context: Context | None = None

    def add(
        self,
        message: Message,
        subject: str,
        *,
        context: Context | None = None,
        order_key: str | None = None,
        msg_id: uuid.UUID | None = None,
        cause_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        emitted = EMITTED_TYPES.get(self.worker)  # None: not a worker (a test's, a bench's)
        if emitted is not None and message.BC_TYPE not in emitted:
            raise NotEmitted(f"{self.worker} emits no {message.BC_TYPE} (principals.EMITS)")
        body, headers = REGISTRY.encode(message)
        context = context if context is not None else self.context
        if context is not None:
            tracing.inject(headers, context)
        msg_id = msg_id or new_msg_id()
        self.rows.append((msg_id, subject, _headers_json(headers), body, order_key))
        fields = message.__dict__  # not getattr: a model's missing attribute costs an exception
        node_id = fields.get("node_id")
        if message.BC_TYPE in HISTORY_TYPES and isinstance(node_id, str):
            # a command's payload and signature stay in `commands`, not in the history
            detail = (
                body.decode()
                if message.BC_TYPE != "dispatch"
                else message.model_dump_json(by_alias=True, exclude={"payload", "signature"})
            )
            self.history.append(
                (
                    node_id,
                    message.BC_TYPE,
                    fields.get("epoch"),
                    fields.get("gateway_id") or _notice_gateway(subject),
                    cause_id,
                    tracing.trace_id(context),
                    detail,
                )
            )
        return msg_id

    async def write(self, conn: asyncpg.Connection) -> int:
        """The messages as one pack (`outbox_packs`) and their history as one pack too
        (`session_history_packs`), in one statement: one round trip, and one row each
        however many messages."""
        if not self.rows:
            return 0
        msg_ids, subjects, headers, bodies, order_keys = (
            list(column) for column in zip(*self.rows, strict=True)
        )
        pack = (msg_ids, subjects, headers, bodies, order_keys)
        if not self.history:  # the pack is this worker's (its relay's to publish)
            await conn.execute(_PACK_ONLY_INSERT, *pack, self.worker)
            return len(self.rows)
        history = [list(column) for column in zip(*self.history, strict=True)]
        await conn.execute(_PACK_AND_HISTORY_INSERT, *pack, *history, self.worker)
        return len(self.rows)


_PACK_INSERT = """
INSERT INTO outbox_packs (worker, size, msg_ids, subjects, headers, bodies, order_keys)
VALUES (NULLIF({worker}::text, ''), cardinality($1::uuid[]), $1::uuid[], $2::text[], $3::text[],
        $4::bytea[], $5::text[])
"""

_PACK_ONLY_INSERT = _PACK_INSERT.format(worker="$6")

# a data-modifying WITH runs to completion whether or not the outer statement reads it;
# the outer one is the pack's, so the statement's span is `INSERT outbox_packs`
_PACK_AND_HISTORY_INSERT = f"""
WITH history AS (
    INSERT INTO session_history_packs
           (worker, node_ids, whats, epochs, gateway_ids, fact_ids, trace_ids, details)
    VALUES ($13, $6::text[], $7::text[], $8::bigint[], $9::text[], $10::uuid[], $11::text[],
            $12::text[])
)
{_PACK_INSERT.format(worker="$13")}"""


@functools.lru_cache(maxsize=4096)  # a worker addresses a few gateways, over and over
def _notice_gateway(subject: str) -> str | None:
    """The gateway a notice subject (`<root>.gw.<gateway_id>.<type>`) is addressed to."""
    split = split_gateway_subject(subject)
    return split[1] if split is not None and split[0] == "gw" else None


@functools.lru_cache(maxsize=256)
def _plain_headers_json(bc_type: str, bc_schema: str) -> str:
    return json.dumps({TYPE_HEADER: bc_type, SCHEMA_HEADER: bc_schema})


def _headers_json(headers: dict[str, str]) -> str:
    """The headers as stored; the common untraced case is one of a few strings."""
    if len(headers) == 2:
        return _plain_headers_json(headers[TYPE_HEADER], headers[SCHEMA_HEADER])
    return json.dumps(headers)
