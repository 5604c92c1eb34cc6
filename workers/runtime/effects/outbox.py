"""The transactional outbox's relay: rows written with a fact's effects (`batch.OutboxBatch`),
published after commit.

`OutboxRelay` (one per process) claims its own workers' rows (or, a dedicated relay, every
row) `FOR UPDATE SKIP LOCKED`, publishes them with their `Nats-Msg-Id`, waits for the
PubAcks and deletes them; rows sharing an `order_key` are published in id order, never
overtaking each other, also across replicas. It is woken by NOTIFY, with a polling
fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence

import asyncpg
import nats.errors
from nats.js import JetStreamContext
from opentelemetry import trace

from schemas.registry import TYPE_HEADER
from schemas.subjects import Subjects
from workers.runtime.base.errors import Severity, as_setting_error, classify
from workers.runtime.base.runtime_settings import DatabaseSettings, OutboxSettings
from workers.runtime.base.waiting import Patience, sleep_or_stop, wait_any
from workers.runtime.bus import sendable
from workers.runtime.bus.acked import BATCH_DISABLED, BATCH_FLOW, AckedPublisher, Message
from workers.runtime.bus.connection import RefusedSubjects
from workers.runtime.bus.deadletter import dead_letter, subject_of
from workers.runtime.bus.principals import EMITS
from workers.runtime.effects import claims
from workers.runtime.effects.claims import Item
from workers.runtime.observability import tracing
from workers.runtime.observability.metrics import Metrics
from workers.runtime.store.notify import Listener

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "outbox"  # `wake_channels` (migration 0057)
#: seconds before a stream that refused fast batches is offered one again (an operator
#: may have set `allow_batched` meanwhile: `bcw provision`)
UNBATCHED_RECHECK = 300.0


class OutboxRelay:
    """Publishes committed outbox rows. Safe to run in every process at once."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        js: JetStreamContext,
        settings: OutboxSettings,
        database: DatabaseSettings,
        metrics: Metrics,
        tracer: trace.Tracer,
        subjects: Subjects,
        refused: RefusedSubjects | None = None,
        owners: Sequence[str] | None = None,
        headers: frozenset[str] | None = None,
    ) -> None:
        self._pool = pool
        #: the header names a row may hold (`sendable.allowed`)
        self._headers = headers if headers is not None else sendable.allowed()
        #: server refusals of rows still in the outbox: {msg_id: how many}
        self._refusals: dict[uuid.UUID, int] = {}
        self._owners = list(owners) if owners else None  # whose rows it claims; None: all
        self._subjects = subjects
        #: subjects this principal may not publish to: their rows are dead-lettered
        self._refused = refused if refused is not None else RefusedSubjects()
        self._js = js
        self._publisher = AckedPublisher(js._nc)
        #: streams that refused a fast batch: {stream: until when (monotonic) not to try}
        self._unbatched: dict[str, float] = {}
        self._settings = settings
        self._metrics = metrics
        self._tracer = tracer
        self._tracing = tracing.is_recording(tracer)
        self._wake = asyncio.Event()
        self._listener = Listener(database, [NOTIFY_CHANNEL], self._wake)

    def wake(self) -> None:
        self._wake.set()

    @property
    def listening(self) -> bool:
        return self._listener.listening

    async def publish_round(self) -> int:
        """Claim, publish and delete one batch; returns how many were published.

        Each row succeeds or fails on its own: published rows are deleted, rows that can
        never be published move to `outbox_dead` with a dead letter (`_bury`), and rows
        that failed for a passing reason stay for the next round (which then raises
        `OutboxPublishError` so the caller backs off) — but a row the server refused (an
        error answer naming it) slows nobody: tried again, and buried the
        `sendable.REFUSALS`th time.
        """
        if not self._js._nc.is_connected:  # publishing now would only buffer
            raise nats.errors.ConnectionReconnectingError
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await claims.claim(conn, self._settings.batch_size, self._owners)
            if not rows:
                return 0
            published, dead, forged, refused = await self._publish(rows)
            if dead:
                await self._bury(rows, dead, forged)
            await claims.settle(conn, rows, published, dead)
        self._metrics.outbox_published.inc(by=len(published))
        if len(published) + len(dead) + refused < len(rows):
            raise OutboxPublishError(
                f"{len(rows) - len(published) - len(dead)} of {len(rows)} rows not acknowledged"
            )
        return len(published) + len(dead)

    async def _publish(self, rows: list[Item]) -> tuple[list[int], dict[int, str], set[int], int]:
        """Publish `rows` pipelined — a stream's rows as fast batches where the stream takes
        them, the rest and any a batch did not store one by one; (ids acknowledged,
        {id: reason} for rows that never can be, the ids of those no worker of ours could
        have written: headers that do not parse or are not a worker's, what their worker
        does not send; how many the server refused, to try again — `sendable.refused`)."""
        spans: dict[int, trace.Span] = {}
        dead: dict[int, str] = {}
        forged: set[int] = set()
        failed: dict[int, BaseException] = {}
        limit = self._js._nc.max_payload
        ready: dict[int, Message] = {}
        for row in rows:
            try:
                headers, why = sendable.read_headers(row.headers, self._headers)
            except (ValueError, TypeError) as bad:  # a row no worker of ours wrote
                dead[row.id] = f"its headers do not parse: {bad}"
                forged.add(row.id)
                continue
            why = why or sendable.type_refusal(self._subjects, row.worker, headers, row.subject)
            if why is not None:
                dead[row.id] = why
                forged.add(row.id)
                continue
            if self._tracing:  # the message carries this span on; else the stored context
                span = spans[row.id] = self._producer_span(row, headers)
                headers.pop("traceparent", None)
                headers.pop("tracestate", None)
                tracing.inject(headers, trace.set_span_in_context(span))
            headers["Nats-Msg-Id"] = str(row.msg_id)
            if len(row.body) > limit:  # checked here: nats-py would leak a publish slot on it
                dead[row.id] = f"{len(row.body)} bytes is over the bus's max payload ({limit})"
            elif row.subject in self._refused:
                dead[row.id] = f"this principal may not publish to {row.subject}"
            else:
                ready[row.id] = (row.subject, row.body, headers)
        done, one_by_one = await self._publish_batched(ready, failed)
        done += await self._publish_one_by_one(
            {row_id: ready[row_id] for row_id in one_by_one}, failed
        )
        if failed:
            self._publisher.forget()
            for row_id, failure in failed.items():
                subject = ready[row_id][0]
                if self._refused.confirm(subject):  # the server said so meanwhile
                    dead[row_id] = f"this principal may not publish to {subject}"
                elif classify(failure) is Severity.PERMANENT:
                    dead[row_id] = f"{type(failure).__name__}: {failure}"
        refused = self._count_refusals(rows, failed, dead) if failed or self._refusals else 0
        for row_id, span in spans.items():
            if row_id in failed:  # error.type: the error's class
                tracing.failed(span, failed[row_id], dead.get(row_id, "not published"))
            elif row_id in dead:
                tracing.failed(span, "refused", dead[row_id])
            span.end()
        return done, dead, forged, refused

    def _count_refusals(
        self, rows: list[Item], failed: dict[int, BaseException], dead: dict[int, str]
    ) -> int:
        """Count each server refusal (`sendable.refused`) against its row, buried (into
        `dead`) the `sendable.REFUSALS`th time in a row; how many are left to try again."""
        left = 0
        for row in rows:
            failure = failed.get(row.id)
            if row.id in dead or failure is None or not sendable.refused(failure):
                self._refusals.pop(row.msg_id, None)  # out, buried, or not refused this time
                continue
            times = self._refusals[row.msg_id] = self._refusals.get(row.msg_id, 0) + 1
            if times < sendable.REFUSALS:
                left += 1
                continue
            del self._refusals[row.msg_id]
            dead[row.id] = (
                f"the server refused it {times} times: {type(failure).__name__}: {failure}"
            )
        if len(self._refusals) > 4 * self._settings.batch_size:  # rows deleted meanwhile
            self._refusals.clear()
        return left

    async def _publish_batched(
        self, ready: dict[int, Message], failed: dict[int, BaseException]
    ) -> tuple[list[int], list[int]]:
        """Publish `ready`'s rows bound for a stream that takes fast batches, as batches
        (`_publish_stream`); returns the rows stored, and those left to publish one by
        one, in the claim's order: the other rows, and those no batch stored."""
        groups: dict[str, list[int]] = {}
        one_by_one: list[int] = []
        now = time.monotonic()
        for row_id, (subject, _body, _headers) in ready.items():
            stream = self._subjects.stream_of(subject)
            if stream is None or self._unbatched.get(stream, 0.0) > now:
                one_by_one.append(row_id)
            else:
                groups.setdefault(stream, []).append(row_id)
        for ids in [ids for ids in groups.values() if len(ids) == 1]:
            one_by_one += ids  # a batch of one costs more than a message
        streams = [(stream, ids) for stream, ids in groups.items() if len(ids) > 1]
        done: list[int] = []
        for stored, left in await asyncio.gather(
            *(self._publish_stream(stream, ids, ready, failed) for stream, ids in streams)
        ):
            done += stored
            one_by_one += left
        later = set(one_by_one)
        return done, [row_id for row_id in ready if row_id in later]  # in the claim's order

    async def _publish_stream(
        self,
        stream: str,
        ids: list[int],
        ready: dict[int, Message],
        failed: dict[int, BaseException],
    ) -> tuple[list[int], list[int]]:
        """One stream's rows as fast batches of at most `BATCH_FLOW`, one after another, so
        that a row never overtakes an earlier one of its stream; returns the rows stored,
        and those a batch did not store with the ones after them (to publish one by one).
        A batch with no answer in time leaves its rows and the later ones in `failed`:
        the next round publishes them again."""
        stored_ids: list[int] = []
        for start in range(0, len(ids), BATCH_FLOW):
            chunk = ids[start : start + BATCH_FLOW]
            try:
                future = await self._publisher.publish_batch([ready[i] for i in chunk])
            except Exception:
                return stored_ids, ids[start:]  # each message names its own failure
            await asyncio.wait([future], timeout=self._settings.publish_timeout)
            if not future.done() or future.cancelled():
                future.cancel()  # lost or slow: the next round publishes them again
                lost = TimeoutError("no PubAck for a fast batch in time")
                failed.update(dict.fromkeys(ids[start:], lost))
                return stored_ids, []
            if (refused := future.exception()) is not None:
                if getattr(refused, "err_code", None) == BATCH_DISABLED:
                    self._unbatched[stream] = time.monotonic() + UNBATCHED_RECHECK
                    log.info(
                        "stream %s does not allow fast batches (bcw provision sets "
                        "allow_batched): publishing to it one message at a time",
                        stream,
                    )
                return stored_ids, ids[start:]  # each message names its own failure
            stored = future.result()
            self._metrics.outbox_batched.inc(by=stored)
            stored_ids += chunk[:stored]
            if stored < len(chunk):
                return stored_ids, ids[start + stored :]
        return stored_ids, []

    async def _publish_one_by_one(
        self, ready: dict[int, Message], failed: dict[int, BaseException]
    ) -> list[int]:
        """Publish each of `ready`'s rows with its own PubAck; returns the ids acked, and
        puts the others' failures in `failed`."""
        futures: dict[int, asyncio.Future[None]] = {}
        for row_id, (subject, body, headers) in ready.items():
            try:
                futures[row_id] = await self._publisher.publish(subject, body, headers)
            except Exception as refused:
                failed[row_id] = refused
        if futures:
            await asyncio.wait(futures.values(), timeout=self._settings.publish_timeout)
        done: list[int] = []
        for row_id, future in futures.items():
            if not future.done():
                future.cancel()  # frees its publish slot
                failed[row_id] = TimeoutError("no PubAck in time")
            elif future.cancelled():
                failed[row_id] = TimeoutError("cancelled")
            elif (nacked := future.exception()) is not None:
                failed[row_id] = nacked
            else:
                done.append(row_id)
        return done

    async def _bury(self, rows: list[Item], dead: dict[int, str], forged: set[int]) -> None:
        """Say on the bus that rows never can be published (`claims.settle` then moves
        them to `outbox_dead`, where each is kept whole). A dedicated relay's letters go to
        `<root>.dead.relay` (its principal's alone), a worker's own relay's to the worker's
        dead letters; each names the row's worker as its sender, which a redrive checks
        (`letters`). A forged row's letter carries none of its headers and the cause
        `forged`: no redrive sends it."""
        limit = self._js._nc.max_payload
        for row in rows:
            reason = dead.get(row.id)
            if reason is None:
                continue
            cause = "forged" if row.id in forged else "unpublishable"
            stored = {} if cause == "forged" else sendable.read_headers(row.headers)[0]
            headers = {**stored, "Nats-Msg-Id": str(row.msg_id)}
            fits = len(row.body) <= limit - 4096  # room for the dead letter's own headers
            source = "relay" if self._owners is None or row.worker not in EMITS else row.worker
            self._metrics.dead_letters.inc(source, cause)
            if self._refused.said(subject_of(self._subjects, source, cause, row.subject)):
                continue  # kept in outbox_dead only (said once, when the server refused it)
            try:
                await dead_letter(
                    self._js,
                    self._subjects,
                    source,
                    subject=row.subject,
                    stream="outbox",
                    stream_seq=row.id,
                    data=row.body if fits else b"",
                    headers=headers,
                    reason=reason,
                    cause=cause,
                    sender=row.worker or "",
                    truncated=None if fits else len(row.body),
                )
            except Exception as error:  # the row is kept whole in outbox_dead for an operator
                log.error(
                    "outbox row %d (%s) kept in outbox_dead only: its dead letter was not "
                    "published (%r)",
                    row.id,
                    row.subject,
                    error,
                )

    def _producer_span(self, row: Item, headers: dict[str, str]) -> trace.Span:
        """The message's PRODUCER span, child of the context stored with its row."""
        span = tracing.start_producer_span(
            self._tracer,
            row.subject,
            str(row.msg_id),
            self._js._nc,
            context=tracing.extract(headers),
        )
        span.set_attribute("bcw.message.type", headers.get(TYPE_HEADER, "message"))
        return span

    async def flush(self, deadline: float) -> int:
        """Publish until none of this relay's rows is left or `deadline` (monotonic)
        passes. A round that publishes nothing while rows are left (another relay holds
        them, or earlier rows of their order key) waits a moment and tries again."""
        total = 0
        while time.monotonic() < deadline:
            published = await self.publish_round()
            total += published
            if not published:
                if not await self.backlog():
                    break
                await asyncio.sleep(0.05)
        return total

    async def backlog(self) -> int:
        """The messages this relay is to publish (its workers', or every one)."""
        async with self._pool.acquire() as conn:
            return (await claims.waiting(conn, self._owners))[0]

    async def observe(self) -> None:
        """Set the outbox gauges: messages waiting for this relay (its workers', or every
        one, as `backlog`), and the age of the oldest — the same whatever the login may see."""
        async with self._pool.acquire() as conn:
            count, age = await claims.waiting(conn, self._owners)
        self._metrics.outbox_backlog.set(float(count))
        self._metrics.outbox_oldest_seconds.set(age)

    async def run(self, stopping: asyncio.Event) -> None:
        listener = asyncio.create_task(self._listener.run(stopping))
        patience = Patience("outbox relay", log, base=0.1, cap=5.0)
        try:
            while not stopping.is_set():
                try:
                    while await self.publish_round() and not stopping.is_set():
                        pass
                    patience.succeeded()
                except Exception as error:
                    severity = classify(error)
                    if severity is Severity.FATAL:
                        raise as_setting_error(error, "outbox relay") from error
                    if severity is Severity.PERMANENT and not isinstance(error, OutboxPublishError):
                        log.exception("outbox relay round failed")
                    self._metrics.outbox_failures.inc()
                    await sleep_or_stop(stopping, patience.failed(error))
                    continue
                self._wake.clear()
                await wait_any((self._wake, stopping), self._settings.poll_seconds)
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener


class OutboxPublishError(RuntimeError):
    """Some claimed rows were not acknowledged by JetStream; they stay for the next round."""
