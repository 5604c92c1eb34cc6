"""One fetched fact on its way through a batch: decoded and checked against its subject,
given its lane and its CONSUMER span. Used by the consume loop (`consumer`); no I/O."""

from __future__ import annotations

import asyncio
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span

from schemas.facts import Fact
from schemas.registry import REGISTRY, MessageError, UnsupportedMajor
from schemas.subjects import SubjectError, Subjects
from workers.runtime.effects import outcome
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Worker
from workers.runtime.observability import tracing

#: The dead-letter cause of a fact parked for its schema major (a metric label, a filter).
UNSUPPORTED_MAJOR = "unsupported-major"


@dataclass
class Item:
    """One fetched message on its way through a batch."""

    msg: Msg
    fact: Fact | None = None
    outcome: Outcome | None = None
    span: Span | None = None

    @property
    def fact_id(self) -> str:
        return str(self.fact.fact_id) if self.fact else "?"

    def context(self) -> Context | None:
        """What the fact's outbox rows carry on: its span, or (no tracing) the producer's."""
        if self.span is not None:
            return trace.set_span_in_context(self.span)
        return tracing.extract(self.msg.headers)


def decode(msg: Msg, subjects: Subjects, worker: Worker) -> Item:
    """The message as an item: its fact, or already its outcome — dead (cannot be parsed,
    or its subject disagrees with it), parked (a schema major this release does not speak:
    not applied, kept in the dead letters for a redrive once the workers speak it) or
    ignored (no rule of `worker` wants it)."""
    item = Item(msg)
    try:
        fact = REGISTRY.decode_fact(msg.headers, msg.data)
        gateway_id, fact_type = subjects.parse_fact(msg.subject)
    except UnsupportedMajor as error:
        item.outcome = outcome.dead(
            f"{error}: upgrade the workers, then redrive", cause=UNSUPPORTED_MAJOR
        )
        return item
    except (MessageError, SubjectError) as error:
        item.outcome = outcome.dead(str(error), cause="invalid")
        return item
    if gateway_id != fact.gateway_id:
        item.outcome = outcome.dead(
            f"gateway mismatch: subject says {gateway_id!r}, fact says {fact.gateway_id!r}",
            cause="invalid",
        )
    elif fact_type != fact.BC_TYPE:
        item.outcome = outcome.dead(
            f"type mismatch: subject says {fact_type!r}, Bc-Type says {fact.BC_TYPE!r}",
            cause="invalid",
        )
    elif fact.BC_TYPE not in worker.fact_types or not worker.wants(fact):
        item.outcome = outcome.IGNORED
    item.fact = fact
    return item


#: bytes of facts decoded between two turns of the event loop (~5 ms of validation)
DECODE_SLICE = 256 * 1024


async def decode_into_lanes(
    msgs: list[Msg], subjects: Subjects, worker: Worker, lanes: int
) -> list[list[Item]]:
    """`msgs` decoded and dealt to `lanes` lanes (`lane_of`), the loop given its turn every
    `DECODE_SLICE` bytes: a batch of a fleet's flushes takes a second to validate, and
    the sweep, the lease renewals and the probes of the process must not wait for it."""
    out: list[list[Item]] = [[] for _ in range(lanes)]
    decoded = 0
    for msg in msgs:
        item = decode(msg, subjects, worker)
        out[lane_of(item, lanes)].append(item)
        decoded += len(msg.data)
        if decoded >= DECODE_SLICE:
            decoded = 0
            await asyncio.sleep(0)
    return out


def lane_of(item: Item, lanes: int) -> int:
    """Same node, same lane (stable across processes: not Python's salted hash)."""
    if lanes == 1 or item.fact is None:
        return 0
    key = getattr(item.fact, "node_id", None) or item.fact.gateway_id
    return zlib.crc32(key.encode()) % lanes


def start_span(tracer: trace.Tracer, item: Item, group: str, nc: Any) -> Span:
    """The item's CONSUMER span (an invalid message's too: a trace shows it was seen)."""
    fact = item.fact
    return tracing.start_consumer_span(
        tracer,
        item.msg,
        str(fact.fact_id) if fact else (item.msg.headers or {}).get("Nats-Msg-Id"),
        group,
        nc,
        fact.BC_TYPE if fact else None,
    )


def merge_queued(
    items: list[Item], queue: asyncio.Queue[list[Item] | None], most: int, most_bytes: int
) -> bool:
    """Add to `items` what waits in `queue`, up to `most` facts and `most_bytes` bytes of
    them (what queued up while a batch was applied goes in one transaction); whether the
    queue's end (None) was met."""
    size = sum(len(item.msg.data) for item in items)
    while len(items) < most and size < most_bytes and not queue.empty():
        more = queue.get_nowait()
        if more is None:
            return True
        items.extend(more)
        size += sum(len(item.msg.data) for item in more)
    return False


def contexts_of(items: Sequence[Item]) -> dict[uuid.UUID, Context]:
    """The trace context each fact of `items` carries on to its outbox rows."""
    return {
        item.fact.fact_id: context
        for item in items
        if item.fact and (context := item.context()) is not None
    }


def stream_positions(
    items: Sequence[Item],
) -> tuple[Callable[[Fact], int | None], Callable[[Fact], datetime | None]]:
    """Each fact's sequence in the facts stream, and the time the stream stored it (read
    from its message's metadata only when asked, and the facts mapped to their messages
    only then: every batch of every worker passes here, and only range facts ask, kept
    by their place in the stream)."""
    messages: dict[uuid.UUID, Msg] = {}

    def message(fact: Fact) -> Msg | None:
        if not messages:
            messages.update({i.fact.fact_id: i.msg for i in items if i.fact is not None})
        return messages.get(fact.fact_id)

    def sequence(fact: Fact) -> int | None:
        msg = message(fact)
        return msg.metadata.sequence.stream if msg is not None else None

    def stored_at(fact: Fact) -> datetime | None:
        msg = message(fact)
        return msg.metadata.timestamp if msg is not None else None

    return sequence, stored_at
