"""What a worker is, to the runtime: its name, the facts it reads, its handler and loops;
and what its handler and loops get to work with (`Tx`, `Runtime`).

Imported by every worker's `build()` and by the runtime. Its I/O is SQL only, on the
connection of a transaction its caller opened and commits: the inbox (`apply_batch`),
the provenance check and the batch's clock (`Tx.fact_time`). It opens no connection and
publishes nothing: `Tx.publish` only queues a message for the outbox.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from opentelemetry import trace
from opentelemetry.context import Context

from schemas.base import Message
from schemas.facts import Fact
from schemas.subjects import Subjects
from workers.runtime.base.settings import RuntimeSettings
from workers.runtime.bus.streams import ConsumerSpec
from workers.runtime.effects import outcome, provenance
from workers.runtime.effects.batch import OutboxBatch
from workers.runtime.effects.outcome import Outcome
from workers.runtime.observability.metrics import Metrics, MetricSet


@dataclass(frozen=True)
class Runtime:
    """The process's shared resources, handed to a worker's loops."""

    settings: RuntimeSettings
    subjects: Subjects
    pool: asyncpg.Pool
    nc: NATS
    js: JetStreamContext
    metrics: Metrics
    tracer: trace.Tracer
    instance: str
    wake_outbox: Callable[[], None]


#: The database's clock against the transaction's own: `bus_time` (migration 0043) in one read.
CLOCK = "SELECT compute_now() - now() AS shift, compute_now() AS now"


class Tx:
    """What a handler gets: the connection inside the batch's transaction, and the outbox."""

    def __init__(
        self,
        conn: asyncpg.Connection,
        subjects: Subjects,
        contexts: Mapping[uuid.UUID, Context],
        worker: str = "",
        bindings: provenance.KnownBindings | None = None,
        sequence: Callable[[Fact], int | None] | None = None,
        stored_at: Callable[[Fact], datetime | None] | None = None,
    ):
        self.conn = conn
        self.subjects = subjects
        self.outbox = OutboxBatch(worker)
        self._contexts = contexts
        #: the gateway bindings its consumer has confirmed lately (`provenance`)
        self.bindings = bindings
        self._sequence = sequence
        self._stored_at = stored_at
        self._clock: tuple[timedelta, datetime] | None = (
            None  # compute_now() - now(), compute_now()
        )

    def sequence(self, fact: Fact) -> int | None:
        """`fact`'s sequence in the facts stream: the order its gateway published it in
        (None: not known, the fact did not come from the stream)."""
        return self._sequence(fact) if self._sequence is not None else None

    def stored_at(self, fact: Fact) -> datetime | None:
        """When the facts stream stored `fact` (None: not known). A stream deleted and made
        again numbers its facts from 1: this time still follows the last one's."""
        return self._stored_at(fact) if self._stored_at is not None else None

    async def fact_time(self, fact: Fact) -> datetime:
        """When `fact` happened, as its events say it (`schemas.events.FactTime`): when its
        gateway observed it, never later than the facts stream stored it — so a re-publish
        (`hello-again`), a re-drive, a source's stall or a publish retried through an outage
        changes nothing — on the one clock, `compute_now()`'s, mapped as `bus_time` maps the
        bus's time (migration 0043) and never later than now."""
        stored = self.stored_at(fact)
        seen = fact.observed_at if stored is None else min(fact.observed_at, stored)
        if self._clock is None:  # once a batch: its transaction's now()
            row = await self.conn.fetchrow(CLOCK)
            assert row is not None
            self._clock = (row["shift"], row["now"])
        shift, now = self._clock
        return min(seen + shift, now)

    def context(self, fact: Fact) -> Context | None:
        """The trace context of `fact`'s processing (to store with work that waits)."""
        return self._contexts.get(fact.fact_id)

    def publish(
        self,
        message: Message,
        subject: str,
        *,
        cause: Fact | None = None,
        order_key: str | None = None,
    ) -> uuid.UUID:
        """Queue `message` for publication after commit, in the trace of the fact that caused it."""
        context = self._contexts.get(cause.fact_id) if cause is not None else None
        return self.outbox.add(
            message,
            subject,
            context=context,
            order_key=order_key,
            cause_id=cause.fact_id if cause is not None else None,
        )


Handler = Callable[[Tx, Sequence[Fact]], Awaitable[Mapping[uuid.UUID, Outcome] | None]]


Loop = Callable[[Runtime, asyncio.Event], Coroutine[Any, Any, None]]
"""A background loop of a worker: runs until the event is set (then returns promptly)."""


def _always(_fact: Fact) -> bool:
    return True


@dataclass(frozen=True)
class Worker:
    """A worker kind: its name (also its durable consumer's), the facts it reads, and its rules.

    `handle` gets the facts of a batch that are new to the inbox, in stream order, inside
    one transaction; it returns an outcome per fact id (missing ones count as APPLIED).
    `wants` says which facts can have effects at all; the others are acked untouched.
    `loops` run beside the consumer for the life of the process (sweeps, dispatch, …).
    """

    name: str
    fact_types: tuple[str, ...]
    handle: Handler
    wants: Callable[[Fact], bool] = _always
    loops: tuple[Loop, ...] = field(default=())
    #: whether each fact is checked against the epochs issued to its gateway before the
    #: handler sees it (`provenance`): every worker of the fleet is; a worker whose facts
    #: are not about a node's sessions (the runtime's own test worker) is not
    bound_to_gateways: bool = True
    #: whether the facts it applied are recorded (its inbox, `processed_facts`), so that a
    #: redelivered fact reaches no rule. False for a worker whose every effect is
    #: idempotent by construction — writes fenced on the epoch, set to a value, published
    #: only when the state changed — so that a redelivery, even after a newer fact, finds
    #: nothing to do (docs/runtime.md, "Exactly once, worker by worker")
    inbox: bool = True
    #: which of a batch's facts its record lets have effects, read in one query before
    #: `provenance` (None: every one `wants` let through). Where `wants` may look at what
    #: a fact says only to let more in, this reads what the database recorded: the
    #: quarantine's, the Hellos its transaction recorded as duplicates, whatever they say
    recorded: Callable[[asyncpg.Connection, Sequence[Fact]], Awaitable[set[uuid.UUID]]] | None = (
        None
    )
    #: its own metrics (defined in its folder): made at its process's start, so that
    #: `/metrics` shows them before their first value
    metrics: tuple[type[MetricSet], ...] = ()
    #: a line each for `/readyz` to say after its checks, read from the process's metrics
    #: at each probe (None: nothing to say): a warning an operator must see
    notes: tuple[Callable[[Metrics], str | None], ...] = ()

    def consumer_spec(self, subjects: Subjects) -> ConsumerSpec:
        return ConsumerSpec(
            durable=self.name,
            filter_subjects=tuple(subjects.fact_filter(t) for t in self.fact_types),
        )


async def apply_batch(
    tx: Tx, worker: Worker, facts: Sequence[Fact]
) -> tuple[list[Fact], dict[uuid.UUID, Outcome]]:
    """A batch inside its transaction (the caller writes `tx.outbox` then commits): the
    facts new to the worker's inbox, in stream order — a fact delivered twice, even twice
    in one batch, is fresh once — go to the handler; a fact whose outcome keeps no inbox
    row leaves none. A worker without an inbox gets each fact of the batch once (its
    first delivery in the batch); one delivered again later reaches its rules again, and
    they find nothing to do. Returns the fresh facts and their outcomes."""
    if not worker.inbox:
        once: dict[uuid.UUID, Fact] = {}
        for fact in facts:
            once.setdefault(fact.fact_id, fact)
        fresh = list(once.values())
        return fresh, await handle_bound(tx, worker, fresh)
    fresh_ids = {
        row["fact_id"]
        for row in await tx.conn.fetch(
            """
            INSERT INTO processed_facts (consumer, fact_id, processed_at)
            SELECT $1, unnest($2::uuid[]), (SELECT compute_now())  -- the default, once
            ON CONFLICT DO NOTHING
            RETURNING fact_id
            """,
            worker.name,
            [fact.fact_id for fact in facts],
        )
    }
    fresh, seen = [], set()
    for fact in facts:
        if fact.fact_id in fresh_ids and fact.fact_id not in seen:
            fresh.append(fact)
        seen.add(fact.fact_id)
    outcomes = await handle_bound(tx, worker, fresh)
    unkept = [fid for fid in fresh_ids if not outcomes[fid].keeps_inbox_row]
    if unkept:
        await tx.conn.execute(
            "DELETE FROM processed_facts WHERE consumer = $1 AND fact_id = ANY($2::uuid[])",
            worker.name,
            unkept,
        )
    return fresh, outcomes


async def handle_bound(tx: Tx, worker: Worker, facts: Sequence[Fact]) -> dict[uuid.UUID, Outcome]:
    """`worker.handle` for the facts that come from a gateway of their node; the others are
    FOREIGN and reach no rule (`provenance`); those the worker's record does not let
    through (`Worker.recorded`) are IGNORED. An outcome per fact (APPLIED by default)."""
    if not facts or worker.recorded is None:
        return await _handle_bound(tx, worker, facts)
    kept = await worker.recorded(tx.conn, facts)
    unrecorded = dict.fromkeys((f.fact_id for f in facts if f.fact_id not in kept), outcome.IGNORED)
    return {
        **unrecorded,
        **await _handle_bound(tx, worker, [f for f in facts if f.fact_id in kept]),
    }


async def _handle_bound(tx: Tx, worker: Worker, facts: Sequence[Fact]) -> dict[uuid.UUID, Outcome]:
    if not facts:
        return {}
    strangers: set[uuid.UUID] = set()
    if worker.bound_to_gateways:
        checked = await provenance.check(tx.conn, facts, tx.bindings)
        strangers = checked.strangers
        # a Hello as its transaction recorded it, never as its gateway says
        facts = [checked.hellos.get(fact.fact_id, fact) for fact in facts]
    bound = [fact for fact in facts if fact.fact_id not in strangers]
    decided = (await worker.handle(tx, bound) or {}) if bound else {}
    return {
        fact.fact_id: (
            outcome.FOREIGN
            if fact.fact_id in strangers
            else decided.get(fact.fact_id, outcome.APPLIED)
        )
        for fact in facts
    }
