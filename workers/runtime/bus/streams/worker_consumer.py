"""A worker's own durable consumer at start: bound as `bcw provision` made it.

A worker's principal may not create, change or delete its consumer (a create request may
name any deliver subject, where the server then sends every fact: DESIGN §9). So a worker
reads its consumer's info; as these settings want it, it binds. Missing or different, it
tries to make it (a development server without auth, or the admin credentials, may); when
that is refused it says which consumer and what differs, and waits for `bcw provision`.
"""

from __future__ import annotations

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import BadRequestError, NotFoundError

#: seconds a duration may differ by (the server keeps nanoseconds; the client floats)
DURATION_TOLERANCE = 0.001
#: seconds to wait for the answer to a create: a refused one is never answered
CREATE_TIMEOUT = 2.0


class ConsumerNotProvisioned(RuntimeError):
    """The worker's consumer is missing or differs, and this principal may not make it:
    `bcw provision` does. Passes once it has (the worker waits)."""


class ConsumerRefused(RuntimeError):
    """The server cannot give an existing consumer these settings in place."""


def _filters(config: ConsumerConfig) -> list[str]:
    if config.filter_subjects:
        return sorted(config.filter_subjects)
    return [config.filter_subject] if config.filter_subject else []


def _same(have: object, want: object) -> bool:
    if isinstance(have, int | float) and isinstance(want, int | float):
        return abs(have - want) <= DURATION_TOLERANCE
    return have == want


def differences(
    current: ConsumerConfig, wanted: ConsumerConfig
) -> dict[str, tuple[object, object]]:
    """{field: (what the consumer has, what `wanted` wants)} over the fields
    `ConsumerSpec.config` sets, and the two it leaves unset that make another consumer of
    it: a deliver subject (a push consumer) and an inactive threshold (the server deletes
    a durable idle that long). Durations within `DURATION_TOLERANCE`. Pure."""
    out: dict[str, tuple[object, object]] = {}
    for field in (
        "deliver_policy",
        "ack_policy",
        "ack_wait",
        "max_deliver",
        "max_ack_pending",
        "max_waiting",
        "deliver_subject",
    ):
        have, want = getattr(current, field), getattr(wanted, field)
        if not _same(have, want):
            out[field] = (have, want)
    if _filters(current) != _filters(wanted):
        out["filter_subjects"] = (_filters(current), _filters(wanted))
    if current.inactive_threshold:
        out["inactive_threshold"] = (current.inactive_threshold, None)
    return out


def said(differs: dict[str, tuple[object, object]]) -> str:
    """The differences as one line's part. Pure."""
    return ", ".join(
        f"{field} {have} (settings: {want})" for field, (have, want) in differs.items()
    )


async def bind_ready(
    js: JetStreamContext, stream: str, durable: str, wanted: ConsumerConfig
) -> str:
    """`ok` when the consumer `durable` of `stream` is as `wanted`; else make it (`created`,
    `updated`) where this principal may. Raises ConsumerNotProvisioned when it may not,
    naming the consumer and what differs; ConsumerRefused when the server cannot change
    it in place."""
    try:
        info = await js.consumer_info(stream, durable)
    except NotFoundError:
        problem, made = "is missing", "created"
    else:
        differs = differences(info.config, wanted)
        if not differs:
            return "ok"
        problem, made = f"differs from these settings: {said(differs)}", "updated"
    try:
        await js.add_consumer(stream, wanted, timeout=CREATE_TIMEOUT)
    except BadRequestError as error:
        raise ConsumerRefused(
            f"consumer {durable} on {stream} cannot take the configured settings: {error}; "
            "delete it (`nats consumer rm`) and run `bcw provision` to recreate it"
        ) from error
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as error:
        # a principal without the grant: the server drops the request, answering nothing
        raise ConsumerNotProvisioned(
            f"consumer {durable} on {stream} {problem}; this worker may not make it: "
            "`bcw provision` makes it"
        ) from error
    return made
