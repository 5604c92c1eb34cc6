"""How far a worker's durable consumer is behind its facts: when the bus stored the oldest
fact (of one type) it has not applied yet.

Read, and recorded (`effects.watermarks`), by a worker's loop whose rules — its own, or
another worker's, or the Hello transaction's — conclude from a fact's absence (a
controller behind its flushes says its gateways are blind for lag). A loop that judges
the world by the facts its worker applied must know when those facts end: a worker
behind its facts must never decide as if the world had gone quiet (docs/workers.md,
"One clock for sight").
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

log = logging.getLogger(__name__)

#: how long the bus may take to say it
TIMEOUT = 2.0


@dataclass(frozen=True)
class Unapplied:
    """The consumer's state: `oldest`, when the bus stored the oldest fact of the type it
    has not applied (acked); None when every such fact is applied."""

    oldest: datetime | None


async def oldest_unapplied(
    js: JetStreamContext, stream: str, consumer: str, subject: str
) -> Unapplied | None:
    """What `consumer` (on `stream`) has not applied of the facts on `subject` (a filter:
    `bc.facts.*.hello`); None when the bus does not say within `TIMEOUT` (this process's
    own link to it is down, or too slow).

    The oldest is the first such fact after the consumer's ack floor: one above it may
    have been acked already (replicas ack out of order), so this may say it is older than
    it is, never newer."""
    try:
        async with asyncio.timeout(TIMEOUT):
            info = await js.consumer_info(stream, consumer)
            if not (info.num_pending or 0) and not (info.num_ack_pending or 0):
                return Unapplied(None)
            floor = (info.ack_floor.stream_seq if info.ack_floor is not None else 0) or 0
            try:
                first = await js.get_msg(stream, seq=floor + 1, next=True, subject=subject)
            except NotFoundError:
                return Unapplied(None)  # facts wait, none of them of this type
    except Exception as error:  # whatever failed (no such consumer too): not known
        log.debug("%s: what it has not applied is not known: %r", consumer, error)
        return None
    return Unapplied(first.time) if first.time is not None else None
