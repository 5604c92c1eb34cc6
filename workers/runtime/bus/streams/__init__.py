"""JetStream provisioning: the streams and the workers' durable consumers.

Called by the entry point (`bcw provision`, each worker at start) and the tests. Creating
is idempotent; a drifted setting is corrected, or reported clearly when the server
cannot change it in place. Which streams, and their bounds, are `layout`'s (re-exported
here); the connection itself is `connection.connect`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig, StreamSource
from nats.js.errors import BadRequestError, NotFoundError

from schemas.subjects import Subjects
from workers.runtime.base.runtime_settings import ConsumerSettings
from workers.runtime.bus.streams.layout import StreamLimits as StreamLimits
from workers.runtime.bus.streams.layout import is_dead_stream
from workers.runtime.bus.streams.layout import limits_of as limits_of
from workers.runtime.bus.streams.layout import stream_configs as stream_configs
from workers.runtime.bus.streams.worker_consumer import (
    ConsumerNotProvisioned as ConsumerNotProvisioned,
)
from workers.runtime.bus.streams.worker_consumer import ConsumerRefused, bind_ready

log = logging.getLogger(__name__)


class ProvisionError(RuntimeError):
    """A stream or consumer exists with a setting the server cannot change in place."""


_UPDATABLE = (
    "subjects",
    "max_age",
    "duplicate_window",
    "num_replicas",
    "discard",
    "max_bytes",
    "max_msgs",
    "max_msg_size",
    "max_msgs_per_subject",
    "discard_new_per_subject",
    "allow_batched",
    "sources",
    # changed in place since nats-server 2.12 (one before it refuses the update, said in
    # its error: recreate the stream there)
    "max_consumers",
)
_FIXED = ("retention", "storage")
#: the server's error code for a stream whose subjects another stream takes
_OVERLAP = 10065


def _differences(
    current: StreamConfig, wanted: StreamConfig, fields: tuple[str, ...]
) -> dict[str, tuple[object, object]]:
    """{field: (what the stream has, what `wanted` wants)} for the fields that differ."""
    return {
        field: (getattr(current, field), getattr(wanted, field))
        for field in fields
        if _differs(getattr(current, field), getattr(wanted, field))
    }


def _drift(current: StreamConfig, wanted: StreamConfig) -> dict[str, tuple[object, object]]:
    """What an existing stream has other than `wanted` wants, field by field; raises
    ProvisionError for what the server cannot change in place (retention, storage)."""
    for field, (have, want) in _differences(current, wanted, _FIXED).items():
        raise ProvisionError(
            f"stream {wanted.name}: {field} is {have}, the contract wants {want}; the server "
            "cannot change it in place (recreate the stream)"
        )
    return _differences(current, wanted, _UPDATABLE)


async def ensure_stream(js: JetStreamContext, wanted: StreamConfig, subjects: Subjects) -> str:
    """Create the stream, or correct its drift. Returns `created`, `updated` or `unchanged`."""
    assert wanted.name is not None
    try:
        info = await js.stream_info(wanted.name)
    except NotFoundError:
        await js.add_stream(wanted)
        log.info("stream %s created", wanted.name)
        return "created"
    _check_switch(info.config, wanted, subjects)
    wanted = await _losing_nothing(js, info.config, wanted)
    drift = _drift(info.config, wanted)
    if not drift:
        return "unchanged"
    log.warning("stream %s drifted, correcting: %s", wanted.name, drift)
    await js.update_stream(wanted)
    return "updated"


async def _losing_nothing(
    js: JetStreamContext, current: StreamConfig, wanted: StreamConfig
) -> StreamConfig:
    """`wanted`, unless it lowers the stream's bound per subject below what a subject holds
    now: the server would then drop that subject's oldest messages at once (facts perhaps
    not applied yet, on the upgrade that bounds the one facts stream per gateway). Then the
    bound stays as it is, said in a WARNING, until a later `bcw provision` finds every
    subject under it (its oldest aged out)."""
    bound, have = wanted.max_msgs_per_subject or -1, current.max_msgs_per_subject or -1
    if bound <= 0 or 0 < have <= bound:
        return wanted
    held = (await js.stream_info(str(wanted.name), subjects_filter=">")).state.subjects or {}
    over = {subject: n for subject, n in held.items() if n > bound}
    if not over:
        return wanted
    fullest = max(over, key=lambda subject: over[subject])
    log.warning(
        "stream %s: not bounded to %d messages per subject yet: %d subject(s) hold more (%s: "
        "%d), which the server would drop; bcw provision bounds it once they are under",
        wanted.name,
        bound,
        len(over),
        fullest,
        over[fullest],
    )
    return dataclasses.replace(
        wanted,
        max_msgs_per_subject=current.max_msgs_per_subject,
        discard_new_per_subject=current.discard_new_per_subject,
    )


def _differs(current: object, wanted: object) -> bool:
    if _is_sources(current) or _is_sources(wanted):  # the streams they name, in any order
        return _source_names(current) != _source_names(wanted)
    if isinstance(current, bool) or isinstance(wanted, bool):  # a server may omit a false one
        return bool(current) != bool(wanted)
    if isinstance(current, float) or isinstance(wanted, float):
        return abs(float(current or 0) - float(wanted or 0)) > 1e-6  # type: ignore[arg-type]
    if isinstance(current, list) and isinstance(wanted, list):
        return sorted(current) != sorted(wanted)
    return current != wanted


def _is_sources(value: object) -> bool:
    return isinstance(value, list) and any(isinstance(v, StreamSource) for v in value)


def _source_names(value: object) -> list[str]:
    return sorted(str(s.name) for s in value) if isinstance(value, list) else []


def _is_gateway_facts(config: StreamConfig, subjects: Subjects) -> bool:
    """Whether `config` is a gateway's own facts stream."""
    return str(config.name).startswith(f"{subjects.facts_stream}_") and bool(config.subjects)


def _takes_own_facts(config: StreamConfig) -> bool:
    """Whether a facts stream takes its facts from the gateways' own streams (sources)."""
    return bool(config.sources) and not config.subjects


def _check_switch(current: StreamConfig, wanted: StreamConfig, subjects: Subjects) -> None:
    """Going back from the gateways' own facts streams to one facts stream is not done in
    place: those streams hold its subjects (the server refuses the overlap) and may hold
    facts not yet sourced. ProvisionError says what to do."""
    if wanted.name == subjects.facts_stream and _takes_own_facts(current) and wanted.subjects:
        raise ProvisionError(
            f"stream {wanted.name} takes its facts from each gateway's own stream "
            f"({', '.join(_source_names(current.sources))}) and BCW_NATS_FACTS_GATEWAYS lists "
            "none: list the gateways again, or, to go back to one facts stream, delete those "
            "streams once the workers have consumed their facts (docs/kubernetes.md)"
        )


async def gateways_sourced(js: JetStreamContext, subjects: Subjects) -> list[str]:
    """The gateways' own facts streams the facts stream takes its facts from (none: it
    takes every gateway's facts itself, or does not exist yet)."""
    try:
        config = (await js.stream_info(subjects.facts_stream)).config
    except NotFoundError:
        return []
    return _source_names(config.sources) if _takes_own_facts(config) else []


async def _as_they_are(
    js: JetStreamContext,
    subjects: Subjects,
    replicas: int,
    limits: StreamLimits | None,
    only: Collection[str] | None = None,
) -> AsyncIterator[tuple[StreamConfig, StreamConfig | None]]:
    """Each stream of the contract (`only` those named: a relay's) as these settings want
    it, and as the server has it (None: the server has no such stream)."""
    for wanted in stream_configs(subjects, replicas, limits):
        if wanted.name is None or (only is not None and wanted.name not in only):
            continue
        try:
            current: StreamConfig | None = (await js.stream_info(wanted.name)).config
        except NotFoundError:
            current = None
        yield wanted, current


async def check_streams(
    js: JetStreamContext, subjects: Subjects, replicas: int = 1, limits: StreamLimits | None = None
) -> dict[str, str]:
    """Each stream of the contract: `ok`, `missing`, or what differs from these settings
    (changing nothing: an operator's edit stays as it is)."""
    out: dict[str, str] = {}
    async for wanted, current in _as_they_are(js, subjects, replicas, limits):
        if current is None:
            out[str(wanted.name)] = "missing"
            continue
        differs = [
            f"{field} {have} (settings: {want})"
            for field, (have, want) in _differences(current, wanted, (*_FIXED, *_UPDATABLE)).items()
        ]
        out[str(wanted.name)] = "differs: " + ", ".join(differs) if differs else "ok"
    return out


async def streams_for_a_worker(
    js: JetStreamContext,
    subjects: Subjects,
    replicas: int = 1,
    limits: StreamLimits | None = None,
    only: Collection[str] | None = None,
) -> dict[str, str]:
    """What a worker does with the streams (`only` those named: a relay's) at start: create
    one that is missing (a development server; else `bcw provision` does), leave an
    existing one as it is — an operator's edit is never reverted, only reported. A stream
    whose retention or storage the contract cannot work with stops the start (ProvisionError)."""
    out: dict[str, str] = {}
    sourced: list[str] = []  # the gateways' streams the facts stream as it is sources
    async for wanted, current in _as_they_are(js, subjects, replicas, limits, only):
        if wanted.name == subjects.facts_stream:
            sourced = _source_names((current or wanted).sources)
        if current is None and _is_gateway_facts(wanted, subjects) and wanted.name not in sourced:
            # it would take facts nobody consumes (or that the facts stream still takes):
            # switching is `bcw provision`'s, which gives the facts stream its sources
            log.warning(
                "stream %s not created: the facts stream does not source it "
                "(bcw provision creates it)",
                wanted.name,
            )
            out[str(wanted.name)] = "missing"
            continue
        if current is None:
            try:
                await js.add_stream(wanted)
            except BadRequestError as error:
                if error.err_code != _OVERLAP or not is_dead_stream(subjects, str(wanted.name)):
                    raise
                # the one dead stream of an older release still takes every publisher's
                # subjects (the server refuses the overlap): letters go there until
                # `bcw provision` narrows it
                log.warning(
                    "stream %s not created (%s): bcw provision creates it",
                    wanted.name,
                    error.description,
                )
                out[str(wanted.name)] = "missing"
                continue
            log.info("stream %s created", wanted.name)
            out[str(wanted.name)] = "created"
            continue
        differs = _drift(current, wanted)
        if differs:
            log.warning(
                "stream %s differs from these settings, left as it is (bcw provision changes "
                "it): %s",
                wanted.name,
                differs,
            )
        out[str(wanted.name)] = "differs" if differs else "ok"
    return out


async def provision_streams(
    js: JetStreamContext, subjects: Subjects, replicas: int = 1, limits: StreamLimits | None = None
) -> dict[str, str]:
    """Create or correct every stream; the facts stream first, so that it gives up its
    subjects before the gateways' own streams take them, and the old dead stream gives up
    its own before each publisher's dead stream takes them."""
    out = {
        str(config.name): await ensure_stream(js, config, subjects)
        for config in stream_configs(subjects, replicas, limits)
        if not is_dead_stream(subjects, str(config.name))
    }
    if (old := await narrow_old_dead_stream(js, subjects)) is not None:
        out[subjects.dead_stream] = old
    for config in stream_configs(subjects, replicas, limits):
        if is_dead_stream(subjects, str(config.name)):
            out[str(config.name)] = await ensure_stream(js, config, subjects)
    return out


async def narrow_old_dead_stream(js: JetStreamContext, subjects: Subjects) -> str | None:
    """The one dead stream of an older release (`BC_DEAD`), if there is one: it gives up
    its subjects (`bc.dead.>`) to each publisher's own stream and keeps its letters, which
    `bcw dead-letters` lists and re-drives until they age out (its `max_age`); it is never
    created. `narrowed`, `kept` (narrowed already), or None (none)."""
    try:
        config = (await js.stream_info(subjects.dead_stream)).config
    except NotFoundError:
        return None
    if config.subjects == [subjects.legacy_dead]:
        return "kept"
    await js.update_stream(dataclasses.replace(config, subjects=[subjects.legacy_dead]))
    log.warning(
        "stream %s narrowed to %s: each publisher's dead letters go to a stream of "
        "its own; its letters are kept",
        subjects.dead_stream,
        subjects.legacy_dead,
    )
    return "narrowed"


@dataclass(frozen=True)
class ConsumerSpec:
    """A worker's durable pull consumer on the facts stream."""

    durable: str
    filter_subjects: tuple[str, ...]

    def config(self, settings: ConsumerSettings) -> ConsumerConfig:
        return ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=settings.ack_wait,
            max_deliver=settings.max_deliver,
            max_ack_pending=settings.max_ack_pending,
            max_waiting=512,
            # one filter goes in `filter_subject`: the create request's subject then names
            # it, so a permission can pin a principal's consumer to its own filter
            filter_subject=self.filter_subjects[0] if len(self.filter_subjects) == 1 else None,
            filter_subjects=list(self.filter_subjects) if len(self.filter_subjects) > 1 else None,
        )


async def ensure_consumer(
    js: JetStreamContext, stream: str, spec: ConsumerSpec, settings: ConsumerSettings
) -> None:
    """Create or update the durable consumer (a bound `pull_subscribe` would ignore changes)."""
    try:
        await js.add_consumer(stream, spec.config(settings))
    except BadRequestError as error:
        raise ProvisionError(
            f"consumer {spec.durable} on {stream} cannot take the configured settings: {error}; "
            "delete it (`nats consumer rm`) to recreate it"
        ) from error


async def consumer_for_a_worker(
    js: JetStreamContext, stream: str, spec: ConsumerSpec, settings: ConsumerSettings
) -> str:
    """A worker's consumer at start (`worker_consumer.bind_ready`): `ok`, or made where
    this principal may; ConsumerNotProvisioned (wait for `bcw provision`) where it may not."""
    try:
        return await bind_ready(js, stream, spec.durable, spec.config(settings))
    except ConsumerRefused as error:
        raise ProvisionError(str(error)) from error


async def facts_fill(
    js: JetStreamContext, subjects: Subjects, limits: StreamLimits
) -> dict[tuple[str, str], float]:
    """{(stream, bound): fill} of the facts stream and of each gateway's own facts stream
    that exists (a missing or unreadable one is left out): its bytes over its `max_bytes`
    and its messages over its `max_msgs` (0.0: no such bound). Either full refuses new
    facts: a flood of empty messages fills a stream by count long before its bytes."""
    out: dict[tuple[str, str], float] = {}
    for name in (subjects.facts_stream, *map(subjects.gateway_facts_stream, limits.gateways)):
        try:
            info = await js.stream_info(name)
        except Exception as error:
            log.debug("no fill of stream %s: %r", name, error)
            continue
        out[(name, "bytes")] = fill(info.state.bytes, info.config.max_bytes)
        out[(name, "messages")] = fill(info.state.messages, info.config.max_msgs)
    return out


def fill(held: int | None, bound: int | None) -> float:
    """`held` over `bound`; 0.0 where there is no bound (None, 0 or -1). Pure."""
    return 0.0 if bound is None or bound <= 0 else (held or 0) / bound
