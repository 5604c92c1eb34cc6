"""The facts a reference gateway publishes on `<root>.facts.<its id>.<type>`, built and
published after commit, at least once (retried with the same Nats-Msg-Id, which
JetStream deduplicates)."""

from __future__ import annotations

import asyncio
import bisect
import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from opentelemetry import trace
from pydantic import TypeAdapter

from schemas import REGISTRY, Fact
from schemas.facts import (
    CLOSE_CODES,
    HASH_SPACE,
    CertInfo,
    Closed,
    CloseReason,
    Hello,
    Liveness,
    LivenessEntry,
    PreviousSession,
    Status,
)
from schemas.subjects import Subjects
from workers.gateway import store
from workers.gateway.admission import HelloRequest
from workers.gateway.types import Session
from workers.runtime.observability import tracing

log = logging.getLogger(__name__)

#: entries of one liveness fact at most
MAX_FLUSH_ENTRIES = 10_000
#: bytes of one liveness fact's entries at most: an entry with a heartbeat's credits and
#: load is ~200 bytes (more with long node ids), so 5,000 sessions — the default
#: maxStreams — would pass the 1 MiB a NATS message may have; smaller facts also spread
#: over the liveness replicas and keep each flush transaction short
MAX_FLUSH_BYTES = 256 * 1024
#: an entry's bytes as the fact carries them
_ENTRY_JSON = TypeAdapter(LivenessEntry)


def entry_bytes(entry: LivenessEntry) -> int:
    """How many bytes `entry` takes in a fact's body. Pure."""
    return len(_ENTRY_JSON.dump_json(entry))


#: sessions of one range of a flush, at most, when the gateway's sessions spread evenly
#: over the ranges: 8 ranges at 5,000 sessions (the default maxStreams), ~625 sessions
#: each — a range of sessions whose heartbeats carry credits and load (~200 bytes an
#: entry) stays within `MAX_FLUSH_BYTES` however they spread, small enough to spread over
#: the liveness replicas, large enough that a fact's own cost stays a small part of its
#: entries'
RANGE_SESSIONS = 1_000


def range_bits(sessions: int, previous: int) -> int:
    """How many bits of the node hash cut a flush of `sessions` into ranges (2**bits of
    them): the fewest that keep `RANGE_SESSIONS` a range, grown as soon as the sessions
    pass that, shrunk only once they fall to a quarter of what the ranges hold — a
    gateway whose sessions come and go around a power of two does not re-cut its ranges
    every period (each cut replaces every range the gateway had). Pure."""
    bits = previous
    while bits < 32 and sessions > RANGE_SESSIONS << bits:
        bits += 1
    while bits > 0 and sessions <= (RANGE_SESSIONS << bits) // 4:
        bits -= 1
    return bits


def range_cut(
    hashes: Sequence[int], sizes: Sequence[int], bits: int, budget: int = MAX_FLUSH_BYTES
) -> list[tuple[int, int, int, int]]:
    """A flush cut into facts by ranges of node hashes: `(range_start, range_end, lo, hi)`
    for each, in order — the sessions `lo:hi` (`hashes` sorted ascending, `sizes` each
    one's encoded entry) are those whose hash is in `[range_start, range_end)`. The hash
    space is cut into `2**bits` equal ranges, every one a fact even when empty; a range
    whose entries pass `budget` bytes or `MAX_FLUSH_ENTRIES` is halved until they fit (a
    range one hash wide goes as it is). Pure."""
    ends = [0]
    for size in sizes:
        ends.append(ends[-1] + size + 1)  # and its comma
    cut: list[tuple[int, int, int, int]] = []

    def split(start: int, end: int, lo: int, hi: int) -> None:
        too_big = ends[hi] - ends[lo] > budget or hi - lo > MAX_FLUSH_ENTRIES
        if too_big and end - start > 1:
            middle = (start + end) // 2
            at = bisect.bisect_left(hashes, middle, lo, hi)
            split(start, middle, lo, at)
            split(middle, end, at, hi)
        else:
            cut.append((start, end, lo, hi))

    width, lo = HASH_SPACE >> bits, 0
    for start in range(0, HASH_SPACE, width):
        hi = bisect.bisect_left(hashes, start + width, lo)
        split(start, start + width, lo, hi)
        lo = hi
    return cut


class FactPublisher:
    def __init__(
        self,
        gateway_id: str,
        js: JetStreamContext,
        subjects: Subjects,
        clock: Callable[[], float],
        tracer: trace.Tracer | None = None,
    ):
        self.gateway_id = gateway_id
        self.js = js
        self.subjects = subjects
        self.clock = clock
        self.tracer = tracer or trace.NoOpTracer()
        #: bits of the node hash its flushes are cut by (`range_bits`)
        self.range_bits = 0

    def base(self) -> dict[str, Any]:
        """`fact_id`, `gateway_id` and `observed_at` (the gateway's clock, informational)."""
        return {
            "fact_id": uuid.uuid4(),
            "gateway_id": self.gateway_id,
            "observed_at": datetime.fromtimestamp(self.clock(), UTC),
        }

    async def fact(self, model: type[Fact], **fields: Any) -> None:
        await self.publish(model.model_validate({**self.base(), **fields}, strict=False))

    def closed(self, node_id: str, epoch: int, reason: CloseReason) -> Closed:
        code = CLOSE_CODES[reason]
        return Closed(**self.base(), node_id=node_id, epoch=epoch, reason=reason, code=code)

    def hello(
        self,
        request: HelloRequest,
        opened: store.Opened,
        upgrade: bool,
        kinds: tuple[str, ...] | None,
        generation: int | None,
        fact_id: uuid.UUID | None = None,
    ) -> Hello:
        """The Hello fact (with `fact_id`: the one the Hello transaction recorded)."""
        base = self.base()
        if fact_id is not None:
            base["fact_id"] = fact_id
        return Hello.model_validate(
            {
                **base,
                "node_id": request.node_id,
                "session_id": opened.session_id,
                "epoch": opened.epoch,
                "role": request.role,
                "boot_id": request.boot_id,
                "journal_id": request.journal_id,
                "daemon_version": request.daemon_version,
                "proto_max": request.proto_max,
                "trust_version": request.trust_version,
                "capabilities": list(request.capabilities),
                "approver_set_epoch": request.approver_set_epoch,
                "approver_set_sha256": request.approver_set_sha256,
                "running_command_ids": list(request.running_command_ids),
                "inventory_hashes": dict(request.inventory_hashes),
                "cert": CertInfo(
                    serial=request.cert_serial,
                    allowed_kinds=list(kinds) if kinds is not None else None,
                    identity_generation=generation,
                ),
                "upgrade_required": upgrade,
                "transport": request.transport,
                "process_started_at": request.process_started_at,
                "results": list(request.results),
                # the Hello transaction tells no gateway of the session before it: the
                # workers read it where that transaction recorded it (session_epochs)
                "previous": PreviousSession(epoch=opened.epoch - 1, live=opened.duplicate),
                "duplicate": opened.duplicate,
                "proven": opened.proven,
                "proof": request.proof,
            },
            strict=False,
        )

    async def publish(self, fact: Fact) -> None:
        """Publish, at least once: retried (same Nats-Msg-Id) until acknowledged."""
        body, headers = REGISTRY.encode(fact)
        headers["Nats-Msg-Id"] = str(fact.fact_id)
        subject = self.subjects.fact(self.gateway_id, fact.BC_TYPE)
        span = tracing.start_producer_span(self.tracer, subject, str(fact.fact_id), self.js._nc)
        with tracing.active(span, end=True):
            tracing.inject(headers)  # every worker's processing is a child of this span
            await self._publish(subject, body, headers, fact.BC_TYPE)

    async def _publish(
        self, subject: str, body: bytes, headers: dict[str, str], fact_type: str
    ) -> None:
        delay = 0.1
        for attempt in range(30):
            try:
                await self.js.publish(subject, body, headers=headers, timeout=5)
                return
            except MaxPayloadError:
                raise  # no retry makes it fit (a flush is cut to fit: `range_cut`)
            except Exception as error:
                if attempt == 29:
                    raise
                log.debug(
                    "gateway %s: publish %s failed (%r), retrying",
                    self.gateway_id,
                    fact_type,
                    error,
                )
                trace.get_current_span().add_event(
                    "retry",
                    {"exception.type": type(error).__name__, "exception.message": str(error)},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def flush(self, sessions: Sequence[Session], now: float) -> None:
        """The liveness flush of `sessions`, a fact per range of their node hashes
        (`range_cut`: every range, empty ones too), then a status fact for each session
        whose daemon applied a higher generation than was last published."""
        sessions = sorted(sessions, key=lambda s: s.hash)
        self.range_bits = range_bits(len(sessions), self.range_bits)
        entries = [
            LivenessEntry(
                node_id=s.node_id,
                epoch=s.epoch,
                age_ms=max(0, int((now - s.last_seen) * 1000)),
                credits=s.credits,
                load=s.load,
                node_load=s.node_load,
            )
            for s in sessions
        ]
        sizes = [entry_bytes(e) for e in entries]
        hashes = [s.hash for s in sessions]
        for start, end, lo, hi in range_cut(hashes, sizes, self.range_bits):
            await self.publish(
                Liveness(**self.base(), entries=entries[lo:hi], range_start=start, range_end=end)
            )
        # the recorder raises observed_generation from it (a status report may come sooner)
        for session in [s for s in sessions if s.applied_generation > s.reported_generation]:
            generation = session.applied_generation
            await self.fact(
                Status,
                node_id=session.node_id,
                epoch=session.epoch,
                observed_generation=generation,
                trust_version=0,  # unchanged
            )
            session.reported_generation = generation
