"""The streams the contract wants (DESIGN §3) and what bounds each: pure, no I/O.

`streams` creates and corrects them on a server. Every facts stream is bounded so that
one gateway cannot fill it for the others (issue #59):

- **a stream per gateway** (`BCW_NATS_FACTS_GATEWAYS`): each gateway's `BC_FACTS_<gw>`
  holds at most `per_gateway` bytes and `msgs_per_gateway` messages, `discard: new` (its
  own new facts refused, nobody else's); `BC_FACTS` sources them all and has no bound of
  its own but their age: it holds what they hold, never full before one of them is;
- **one facts stream** (no list): `BC_FACTS` holds at most `max_bytes` and `max_msgs`;
  each gateway publishes to its own subject per fact type only (`principals`), and each
  such subject holds at most `per_subject` messages, its new ones refused beyond
  (`discard_new_per_subject`): one gateway holds at most `msgs_per_gateway` messages of
  it, whatever it sends. Its bytes are not bounded below the stream's (NATS bounds bytes
  per stream, not per subject): one gateway can still fill it by bytes.

Dead letters, likewise: each publisher (each worker, the relay) has a stream of its own,
`BC_DEAD_<publisher>`, of its subjects only, at most `dead_bytes` (its oldest dropped
beyond) and `dead_per_source` letters per subject: a principal that invents a subject per
letter evicts only its own letters, never another's (a gateway's parked fact, say).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nats.js.api import (
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamSource,
)

from schemas.facts import FACT_TYPES
from schemas.subjects import Subjects
from workers.runtime.base.runtime_settings import NatsSettings
from workers.runtime.bus import server
from workers.runtime.bus.principals import dead_publishers

HOUR = 3600.0
DAY = 24 * HOUR
DUPLICATE_WINDOW = 120.0


@dataclass(frozen=True)
class StreamLimits:
    """What one gateway (or anything else) may fill a stream with at most."""

    max_bytes: int = -1  # JetStream reserves it per stream: bounded where deployed (chart)
    max_msgs: int = 50_000_000
    max_msg_size: int = 2**20
    max_consumers: int = 64
    #: dead letters per subject (worker, cause, source): `deadletter.subject_of`
    dead_per_source: int = 10_000
    #: gateways whose facts each go to a stream of their own (`per_gateway` bytes at most)
    #: that the facts stream sources; none: the facts stream takes every gateway's facts
    gateways: tuple[str, ...] = ()
    per_gateway: int = 4 * 2**30
    #: each stream's max age, in seconds
    facts_age: float = DAY
    events_age: float = 7 * DAY
    notices_age: float = HOUR
    dead_age: float = 14 * DAY
    #: the events' own bound in bytes, and each dead-letter publisher's (0: `max_bytes`)
    events_bytes: int = 0
    dead_bytes: int = 0
    #: JetStream fast batches (`allow_batched`): only where the server has them (2.14+)
    batched: bool = True
    #: messages one gateway's facts take at most: its own stream's bound, or (one facts
    #: stream) its subjects' together (`per_subject`)
    msgs_per_gateway: int = 5_000_000
    #: who publishes dead letters, each to a stream of its own (a process of a worker
    #: not of the fleet's, a test's, names its own)
    dead_publishers: tuple[str, ...] = field(default_factory=dead_publishers)
    #: the notices stream's consumers at most: a durable each gateway, so above the fleet's
    #: gateways (`max_consumers` bounds the other streams)
    notices_consumers: int = 4096

    @property
    def per_subject(self) -> int:
        """Messages each of a gateway's subjects (one per fact type) keeps at most in the
        one facts stream: a gateway's `msgs_per_gateway` over its fact types."""
        return max(1, math.ceil(self.msgs_per_gateway / len(FACT_TYPES)))


def limits_of(settings: NatsSettings, server_version: str | None = None) -> StreamLimits:
    """The streams' bounds these settings give, on nats-server `server_version` (None: a
    server with every feature; an older one gets no fast batches: `server`)."""
    return StreamLimits(
        settings.stream_max_bytes,
        settings.stream_max_msgs,
        settings.max_msg_size,
        settings.stream_max_consumers,
        settings.dead_letters_per_source,
        settings.gateways_with_own_facts,
        settings.facts_bytes_per_gateway,
        settings.facts_max_age,
        settings.events_max_age,
        settings.notices_max_age,
        settings.dead_max_age,
        settings.events_max_bytes,
        settings.dead_max_bytes,
        server_version is None or server.has_fast_batches(server_version),
        settings.facts_msgs_per_gateway,
        notices_consumers=settings.notices_max_consumers,
    )


def stream_configs(
    subjects: Subjects, replicas: int = 1, limits: StreamLimits | None = None
) -> list[StreamConfig]:
    """The streams of the contract (DESIGN §3), bounded by `limits`."""
    limits = limits or StreamLimits()

    def stream(
        name: str,
        subject_list: list[str],
        max_age: float,
        discard: DiscardPolicy,
        per_subject: int = -1,
        max_bytes: int = limits.max_bytes,
        sources: list[StreamSource] | None = None,
        max_msgs: int = limits.max_msgs,
        new_per_subject: bool = False,
        max_consumers: int = limits.max_consumers,
    ) -> StreamConfig:
        return StreamConfig(
            max_msgs_per_subject=per_subject,
            discard_new_per_subject=new_per_subject,
            name=name,
            subjects=subject_list or None,
            sources=sources,
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=discard,
            max_age=max_age,
            num_replicas=replicas,
            # every stream: the outbox relay and the dead-letter path re-publish with the
            # same Nats-Msg-Id after a failure, and rely on JetStream to drop the double
            duplicate_window=DUPLICATE_WINDOW,
            max_bytes=max_bytes,
            max_msgs=max_msgs,
            max_msg_size=limits.max_msg_size,
            max_consumers=max_consumers,
            # the outbox relay publishes a batch of rows as one fast batch (one PubAck);
            # a server before 2.14 refuses the field itself: not sent there
            allow_batched=True if limits.batched else None,
        )

    old, new = DiscardPolicy.OLD, DiscardPolicy.NEW
    # full: new facts are refused (their gateways retry) rather than unapplied ones dropped
    facts_age = limits.facts_age
    facts = [
        stream(
            subjects.facts_stream,
            [subjects.all_facts],
            facts_age,
            new,
            per_subject=limits.per_subject,
            new_per_subject=True,
        )
    ]
    if limits.gateways:
        # each gateway fills a stream of its own, and only its own; the facts stream (what
        # the workers consume) sources them all, so it holds at most what they hold
        facts = [
            stream(
                subjects.facts_stream,
                [],
                facts_age,
                new,
                max_bytes=-1,
                max_msgs=-1,
                sources=[
                    StreamSource(name=subjects.gateway_facts_stream(g)) for g in limits.gateways
                ],
            ),
            *(
                stream(
                    subjects.gateway_facts_stream(g),
                    [subjects.gateway_facts(g)],
                    facts_age,
                    new,
                    max_bytes=limits.per_gateway,
                    max_msgs=limits.msgs_per_gateway,
                )
                for g in limits.gateways
            ),
        ]
    return [
        *facts,
        stream(
            subjects.events_stream,
            [subjects.all_events, subjects.revocations],
            limits.events_age,
            old,
            max_bytes=limits.events_bytes or limits.max_bytes,
        ),
        stream(
            subjects.gateway_stream,
            [subjects.all_notices],
            limits.notices_age,
            old,
            max_consumers=limits.notices_consumers,
        ),
        # each publisher's own: within it each cause and source keeps its newest letters,
        # so one gateway's junk never evicts another's letters, nor a parked fact
        # (`deadletter.subject_of`); and its bytes are its own
        *(
            stream(
                subjects.dead_stream_of(p),
                subjects.dead_of(p),
                limits.dead_age,
                old,
                limits.dead_per_source,
                max_bytes=limits.dead_bytes or limits.max_bytes,
            )
            for p in limits.dead_publishers
        ),
    ]


def is_dead_stream(subjects: Subjects, name: str) -> bool:
    """Whether `name` is a publisher's own dead-letter stream. Pure."""
    return name.startswith(f"{subjects.dead_stream}_")
