"""The consume loop: facts in batches from a worker's durable consumer, applied with
exactly-once effect, settled in one place.

For each batch: decode (bad messages are dead-lettered), drop the facts the worker's
rules ignore (acked without a transaction), then in one transaction record the rest in
the inbox, skip those already there, let the worker's handler write its effects and its
outbox rows, and commit; acks follow the commit.

Failures (classified in `errors`): an outage is waited out, however long — the lane
holds its batch and retries with capped, jittered back-off while every message in hand
is kept alive with `in_progress()`, so nothing is redelivered, nothing counts towards
`max_deliver` and a node's facts keep their stream order. Only a failure that retrying
cannot fix, or a transient one that repeats while PostgreSQL and NATS both answer, is
pinned on a fact (by applying the batch one fact at a time) and dead-lettered. A fatal
error (grants, credentials) stops the process.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import asyncpg
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from opentelemetry import trace

from schemas.subjects import Subjects
from workers.runtime.base.errors import Severity, as_setting_error, classify
from workers.runtime.base.retrying import Pinned, Waiting, patiently
from workers.runtime.base.runtime_settings import ConsumerSettings
from workers.runtime.base.waiting import Patience, sleep_or_stop
from workers.runtime.bus.deadletter import dead_letter_msg
from workers.runtime.bus.frames import FrameWriter
from workers.runtime.bus.pull import ContinuousPull
from workers.runtime.effects import outcome
from workers.runtime.effects.inhand import InHand
from workers.runtime.effects.items import (
    Item,
    contexts_of,
    decode_into_lanes,
    merge_queued,
    start_span,
    stream_positions,
)
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.provenance import ForeignLog, KnownBindings
from workers.runtime.effects.shedding import Shedder, shed
from workers.runtime.effects.worker import Tx, Worker, apply_batch
from workers.runtime.observability import tracing
from workers.runtime.observability.metrics import Metrics
from workers.runtime.store import db

#: a fact whose row another session kept locked past `lock_timeout` is redelivered after
#: this (a nak: it counts towards `max_deliver`)
LOCKED_RETRY_SECONDS = 2.0

log = logging.getLogger(__name__)


def _stream_seq(msg: Msg) -> int:
    try:
        return int(msg.metadata.sequence.stream)
    except Exception:  # not a JetStream delivery: where it is
        return 0


class FactConsumer:
    """Runs one worker's consume loop in this process."""

    def __init__(
        self,
        worker: Worker,
        *,
        nc: NATS,
        js: JetStreamContext,
        pool: asyncpg.Pool,
        subjects: Subjects,
        settings: ConsumerSettings,
        metrics: Metrics,
        tracer: trace.Tracer,
        on_outbox_rows: Callable[[], None] = lambda: None,
    ) -> None:
        self.worker = worker
        self._js = js
        self._pool = pool
        self._subjects = subjects
        self._settings = settings
        self._metrics = metrics
        self._tracer = tracer
        self._tracing = tracing.is_recording(tracer)
        self._on_outbox_rows = on_outbox_rows
        self._nc = nc
        self._frames = FrameWriter(nc)
        self._pull: ContinuousPull | None = None
        self._stopping = asyncio.Event()
        self._in_hand = InHand(settings.ack_wait)
        self._foreign = ForeignLog(log, worker.name)
        self._shedder = Shedder(worker.name)
        self._bindings = KnownBindings()

    @property
    def bound(self) -> bool:
        return self._pull is not None

    async def bind(self) -> None:
        if self._pull is None:
            pull = ContinuousPull(
                self._nc,
                self._subjects.facts_stream,
                self.worker.name,
                batch=self._settings.batch_size,
                window=2 * self._settings.batch_size,
                expires=1.0,  # what a stop waits for, at most, before it releases
                on_message=self._in_hand.hold,
                max_bytes=self._settings.batch_bytes,
                linger=self._settings.linger,
            )
            await pull.start()
            self._pull = pull

    # -- the loop --------------------------------------------------------------------
    async def run(self, stopping: asyncio.Event) -> None:
        """Fetch and decode ahead; apply in `lanes` concurrent lanes; stop when `stopping`.

        A fact's lane is chosen by its node (or gateway, for facts of many nodes), so one
        node's facts are applied in stream order, in one lane, while the other lanes and
        the next fetch go on beside it.
        """
        await self.bind()
        self._stopping = stopping
        keeper = asyncio.create_task(
            self._in_hand.keep_alive(), name=f"{self.worker.name}-keepalive"
        )
        queues: list[asyncio.Queue[list[Item] | None]] = [
            asyncio.Queue(maxsize=8) for _ in range(self._settings.lanes)
        ]
        fetcher = asyncio.create_task(
            self._fetch_loop(queues, stopping), name=f"{self.worker.name}-fetch"
        )
        lanes = [
            asyncio.create_task(self._lane(queue, stopping), name=f"{self.worker.name}-lane-{i}")
            for i, queue in enumerate(queues)
        ]
        try:
            await asyncio.gather(*lanes)
        finally:
            fetcher.cancel()
            for lane in lanes:
                lane.cancel()
            await asyncio.gather(fetcher, *lanes, return_exceptions=True)
            assert self._pull is not None
            await self._pull.quiesce(within=1.5)  # what the server already sent us arrives
            keeper.cancel()
            # everything received and not settled goes back for redelivery at once: the
            # pull's buffer, the queued batches, and a batch a cut-short drain left
            # half-done (if it committed after all, the inbox absorbs the redelivery) —
            # in stream order, and only now that no pull request is open: a fact released
            # earlier came back to this process behind later ones (JetStream redelivers a
            # released fact at once), and the next replica applied a node's facts out of order
            held = sorted(self._in_hand.take_all(), key=_stream_seq)
            await self._release([Item(msg) for msg in held])
            if held:
                log.info("%s: released %d fact(s) for redelivery", self.worker.name, len(held))
            await asyncio.gather(keeper, return_exceptions=True)

    async def _lane(self, queue: asyncio.Queue[list[Item] | None], stopping: asyncio.Event) -> None:
        ending = False
        while not ending:
            items = await queue.get()
            if items is None:
                break
            # what queued up while the last batch was applied goes in one transaction
            ending = merge_queued(
                items, queue, self._settings.batch_size, self._settings.batch_bytes
            )
            try:
                if not stopping.is_set():
                    await self.handle_items(items)
                # stopping: not started, left in hand; released with the rest once the pull
                # is quiet, in stream order (`run`), for another replica to take at once
            finally:
                self._pull.done([item.msg for item in items])  # type: ignore[union-attr]

    async def _fetch_loop(
        self, queues: list[asyncio.Queue[list[Item] | None]], stopping: asyncio.Event
    ) -> None:
        assert self._pull is not None
        patience = Patience(f"{self.worker.name}: pulling facts", log, cap=5.0)
        while not stopping.is_set():
            try:
                msgs = await self._pull.next_batch(self._settings.fetch_timeout)
                patience.succeeded()
            except Exception as error:  # the connection is down: requests wait for it
                await sleep_or_stop(stopping, patience.failed(error))
                continue
            msgs = await shed(msgs, self._shedder, self._subjects, self._shed)
            if not msgs:
                continue
            lanes = await decode_into_lanes(msgs, self._subjects, self.worker, len(queues))
            for queue, items in zip(queues, lanes, strict=True):
                if items:
                    await queue.put(items)
        for queue in queues:
            await queue.put(None)  # ends each lane once it has taken what is queued

    def _shed(self, msg: Msg, fact_type: str) -> None:
        self._in_hand.drop(msg)
        self._pull.done([msg])  # type: ignore[union-attr]
        self._metrics.facts.inc(self.worker.name, fact_type, "shed")

    async def _release(self, items: Sequence[Item]) -> None:
        """Hand messages back for redelivery at once (the process is stopping)."""
        for item in items:
            self._in_hand.drop(item.msg)
            with contextlib.suppress(Exception):
                await item.msg.nak()

    # -- one batch -------------------------------------------------------------------
    async def handle_items(self, items: Sequence[Item]) -> list[Outcome]:
        started = time.perf_counter()
        wanted = [item for item in items if item.outcome is None]
        if self._tracing:  # ignored and invalid ones too: a trace shows they were seen
            for item in items:
                item.span = start_span(self._tracer, item, self.worker.name, self._nc)
        if wanted:
            await self._apply_patiently(wanted)
        settled: collections.Counter[tuple[str, str, str]] = collections.Counter()
        now = datetime.now(UTC)
        acks: list[Msg] = []
        for item in items:
            await self._settle(item, acks)
            assert item.outcome is not None  # settling may have made it DEAD
            kind = item.outcome.kind.value
            settled[(self.worker.name, item.fact.BC_TYPE if item.fact else "invalid", kind)] += 1
            if item.fact is not None and item.outcome.kind is outcome.Kind.APPLIED:
                age, of = (now - item.fact.observed_at).total_seconds(), item.fact.BC_TYPE
                self._metrics.fact_age.observe(max(0.0, age), self.worker.name, of, span=item.span)
        try:
            await self._frames.write_acks(acks)
        except Exception as error:  # redelivered: the inbox (or idempotence) absorbs them
            log.warning("%s: could not ack %d fact(s): %s", self.worker.name, len(acks), error)
        for labels, count in settled.items():  # once per kind of fact: not per message
            self._metrics.facts.inc(*labels, by=count)
        self._metrics.batch_seconds.observe(time.perf_counter() - started, self.worker.name)
        return [item.outcome for item in items if item.outcome is not None]

    async def _apply_patiently(self, items: list[Item]) -> None:
        """Apply `items` in one transaction, waiting out outages; pin anything else on a fact.

        Retried with tenacity (jittered exponential back-off up to
        `retry_max_seconds`, a sleep that a stop cuts short). A transient failure while
        PostgreSQL or NATS is away costs nothing: the batch is tried again for as long as
        the outage lasts (or until the process stops: then the batch is released for
        redelivery). A permanent failure, or `retry_attempts` transient ones while both
        servers answer (a statement that always times out, say), splits the batch into
        single facts; a single fact that fails so is dead-lettered. A lock another
        session kept past `lock_timeout` splits the batch at once, and the fact behind it
        is handed back for a later delivery (RETRY), never dead-lettered for it. Fatal
        errors are raised: they stop the process.
        """
        name = self.worker.name
        patience = Patience(f"{name}: applying {len(items)} fact(s)", log)
        healthy_failures = 0

        async def attempt() -> None:
            nonlocal healthy_failures
            try:
                await self._apply(items)
            except asyncpg.LockNotAvailableError as error:  # a row held elsewhere: not ours
                raise Pinned(error, "locked") from error
            except Exception as error:
                severity = classify(error)
                if severity is Severity.FATAL:
                    raise as_setting_error(error, name) from error
                if severity is Severity.PERMANENT:
                    raise Pinned(error, "handler") from error
                self._metrics.batch_retries.inc(name)
                for item in items:  # the retries show on each fact's span
                    if item.span is not None:
                        item.span.add_event(
                            "retry",
                            {
                                "exception.type": type(error).__name__,
                                "exception.message": str(error),
                            },
                        )
                healthy = await self._servers_answer()
                if healthy:  # a deadlock, a timeout: the batch's own, tried a few times
                    healthy_failures += 1
                    if healthy_failures >= self._settings.retry_attempts:
                        raise Pinned(error, "retries", healthy_failures) from error
                    log.info("%s: batch failed (%r), retrying", name, error)
                raise Waiting(error, healthy) from error

        retrying = patiently(self._stopping, self._settings.retry_max_seconds, patience)
        try:
            await retrying(attempt)
            patience.succeeded()
            return
        except Waiting:  # stopping in the middle of an outage
            for item in items:
                item.outcome = outcome.RELEASED
            return
        except Pinned as pinned:
            if len(items) == 1 and pinned.cause == "locked":
                log.info("%s: fact %s waits for a row locked elsewhere", name, items[0].fact_id)
                items[0].outcome = outcome.retry_after(LOCKED_RETRY_SECONDS)
                return
            if len(items) == 1:
                if pinned.cause == "handler":
                    log.error(
                        "%s: fact %s cannot be applied: %r", name, items[0].fact_id, pinned.error
                    )
                items[0].outcome = outcome.dead(pinned.reason, cause=pinned.cause)
                return
        self._metrics.batch_splits.inc(name)
        for item in items:  # find the fact behind it, keeping stream order
            if self._stopping.is_set():  # stopping: the rest goes back for redelivery
                item.outcome = outcome.RELEASED
                continue
            await self._apply_patiently([item])

    async def _servers_answer(self) -> bool:
        """Both servers reachable now: a failure now is the batch's, not an outage's."""
        return self._nc.is_connected and await db.usable(self._pool)

    async def _apply(self, items: list[Item]) -> None:
        facts = [item.fact for item in items if item.fact is not None]
        contexts, positions = contexts_of(items), stream_positions(items)
        spans = [item.span for item in items if item.span is not None]
        messages = [item.msg for item in items if item.span is not None]  # statements: below
        with tracing.batch_span(self._tracer, self.worker.name, spans, messages):
            async with self._pool.acquire() as conn, conn.transaction():
                tx = Tx(
                    conn, self._subjects, contexts, self.worker.name, self._bindings, *positions
                )
                fresh, outcomes = await apply_batch(tx, self.worker, facts)
                written = await tx.outbox.write(conn)
        firsts = {id(fact) for fact in fresh}
        for item in items:
            assert item.fact is not None
            item.outcome = (
                outcomes[item.fact.fact_id] if id(item.fact) in firsts else outcome.DUPLICATE
            )
            if item.span is not None:
                item.span.set_attribute("messaging.batch.message_count", len(items))
                item.span.set_attribute("bcw.outbox.rows", written)
        if written:
            self._on_outbox_rows()

    async def _settle(self, item: Item, acks: list[Msg]) -> None:
        """The one place where a fact's message is acked (added to `acks`, which the
        batch sends in one write), nak'ed or dead-lettered."""
        result = item.outcome
        assert result is not None
        msg = item.msg
        self._in_hand.drop(msg)
        if (
            result.kind is outcome.Kind.RETRY
            and (msg.metadata.num_delivered or 1) >= self._settings.max_deliver
        ):
            result = item.outcome = outcome.dead(
                f"still failing after {self._settings.max_deliver} deliveries",
                cause="max-deliveries",
            )
        fact_type = item.fact.BC_TYPE if item.fact else "invalid"
        try:
            if result.acks:
                acks.append(msg)
            elif result.kind is outcome.Kind.RELEASED:
                await msg.nak()
            elif result.kind is outcome.Kind.RETRY:
                await msg.nak(delay=result.delay)
            else:
                await dead_letter_msg(
                    self._js, self._subjects, self.worker.name, msg, result.reason, result.cause
                )
                self._metrics.dead_letters.inc(self.worker.name, result.cause)
                await msg.term()
        except Exception as error:  # the message will be redelivered; the inbox absorbs it
            log.warning(
                "%s: could not settle %s (%s): %s",
                self.worker.name,
                fact_type,
                result.kind.value,
                error,
            )
        if result.kind is outcome.Kind.STALE:
            self._metrics.fencing_misses.inc(self.worker.name, fact_type)
        if result.kind in (outcome.Kind.STALE, outcome.Kind.FOREIGN) and item.fact is not None:
            self._shedder.saw(item.fact, stale=result.kind is outcome.Kind.STALE)  # floods shed
        if result.kind is outcome.Kind.FOREIGN and item.fact is not None:
            self._foreign.saw(item.fact)
        if item.span is not None:
            item.span.set_attribute("bcw.outcome", result.kind.value)
            if result.kind is outcome.Kind.DEAD:  # error.type: the dead letter's cause
                tracing.failed(item.span, result.cause or "dead", result.reason)
            item.span.end()

    async def observe(self) -> None:
        """Refresh the consumer's pending gauges (called by the process's observer loop)."""
        info = await self._js.consumer_info(self._subjects.facts_stream, self.worker.name)
        self._metrics.consumer_pending.set(float(info.num_pending or 0), self.worker.name)
        self._metrics.consumer_ack_pending.set(float(info.num_ack_pending or 0), self.worker.name)
