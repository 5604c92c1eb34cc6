"""What an outbox relay may send of a row (issue #59, finding 5): the relay trusts no row — a
worker's login may write any row of its own — so each row is checked alone before any is
published, and a row that fails is dead-lettered alone, with the reason, never retried:

- its headers: a JSON map, each name one a worker's outbox writes (`allowed`: the message's
  type and schema, the trace context; never a `Nats-*` header, which would ask the server
  for a rollup, an expected sequence, a TTL…), each value a string of printable characters
  and bounded length (no CR or LF to end a header line);
- its type and subject: what its worker sends (`principals.refusal`);
- and once sent, a message the server refuses (`refused`) is tried again `REFUSALS` times
  at most, slowing no other row.

Pure, but for `allowed`, which reads the process's trace propagator once.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import nats.js.errors

from schemas.registry import SCHEMA_HEADER, TYPE_HEADER
from schemas.subjects import Subjects
from workers.runtime.bus.principals import EMITS, refusal
from workers.runtime.observability import tracing

#: the headers a worker's outbox writes (`batch.OutboxBatch.add`): its message's type and
#: schema (`REGISTRY.encode`) and the W3C trace context (`tracing.inject`)
HEADERS = frozenset({TYPE_HEADER, SCHEMA_HEADER, "traceparent", "tracestate", "baggage"})
#: the fields of the standard trace propagators (W3C, B3 single and multi, Jaeger, OT,
#: X-Ray), lower case: a worker and its relay may run with different `OTEL_PROPAGATORS`
#: (a cluster-wide injection reaches one pod before another), so a traced row is never
#: buried for a context its relay's propagator would not have written
PROPAGATION = frozenset(
    {
        "traceparent",
        "tracestate",
        "baggage",
        "b3",
        "x-b3-traceid",
        "x-b3-spanid",
        "x-b3-parentspanid",
        "x-b3-sampled",
        "x-b3-flags",
        "uber-trace-id",
        "ot-tracer-traceid",
        "ot-tracer-spanid",
        "ot-tracer-sampled",
        "x-amzn-trace-id",
    }
)
#: a header value's length at most (W3C: tracestate 512, baggage 8192 bytes)
MAX_VALUE = 8192
#: a row's stored headers' text at most (every header a worker writes, each at most
#: `MAX_VALUE`, fits several times over)
MAX_TEXT = 4 * MAX_VALUE
#: how often in a row the server may refuse one row (an error answer naming that message,
#: not an outage) before the relay dead-letters it: never retried for ever
REFUSALS = 3


def allowed() -> frozenset[str]:
    """`HEADERS` and the fields of this process's trace propagator (`OTEL_PROPAGATORS`: b3,
    say), never one the NATS server reads (`Nats-*`)."""
    fields = set(tracing.propagator().fields)
    return frozenset(n for n in HEADERS | fields if not n.lower().startswith("nats-"))


def header_refusal(headers: object, names: frozenset[str] = HEADERS) -> str | None:
    """Why a row's stored headers may not go out, or None: not a map, a name not in
    `names`, a value not a string, too long, or holding a character that is not printable
    (a control character: CR, LF, NUL…). Pure."""
    if not isinstance(headers, dict):
        return "its headers are not a map"
    for name, value in headers.items():
        if name not in names and str(name).lower() not in PROPAGATION:
            return f"header {_shown(name)} is not one a worker sends"
        if not isinstance(value, str):
            return f"header {name} is not a string ({type(value).__name__})"
        if len(value) > MAX_VALUE:
            return f"header {name} is {len(value)} characters long (at most {MAX_VALUE})"
        if not value.isprintable():
            return f"header {name} holds a character that is not printable"
    return None


def _shown(name: str) -> str:
    return repr(name if len(name) <= 64 else name[:64] + "…")


def read_headers(text: str, names: frozenset[str] = HEADERS) -> tuple[Any, str | None]:
    """The headers a row stored (a dict of its own: untraced rows share one of a few), and
    why they may not go out (`header_refusal`; None: they may) — checked once per text
    where rows share it. Raises ValueError or TypeError when the text is no JSON."""
    if "traceparent" in text:  # one of its own
        headers = _loads(text)
        return headers, header_refusal(headers, names)
    headers, why = _parsed(text, names)
    return (dict(headers) if isinstance(headers, dict) else headers), why


@functools.lru_cache(maxsize=256)
def _parsed(text: str, names: frozenset[str]) -> tuple[Any, str | None]:
    headers = _loads(text)
    return headers, header_refusal(headers, names)


def _loads(text: str) -> Any:
    """The stored headers' JSON; ValueError for text no outbox writes: longer than
    `MAX_TEXT`, or nested past the parser's recursion (a RecursionError, no ValueError,
    would end the relay's round for every row)."""
    if len(text) > MAX_TEXT:
        raise ValueError(f"{len(text)} characters (at most {MAX_TEXT})")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deep") from None


def row_refusal(
    subjects: Subjects,
    worker: str | None,
    headers: object,
    subject: str,
    names: frozenset[str] = HEADERS,
) -> str | None:
    """Why a relay must not publish a row that parsed, or None: its headers
    (`header_refusal`), then what it sends (`type_refusal`). Pure."""
    return header_refusal(headers, names) or type_refusal(subjects, worker, headers, subject)


def type_refusal(
    subjects: Subjects, worker: str | None, headers: object, subject: str
) -> str | None:
    """Why a relay must not publish a row whose headers passed (`header_refusal`): a fleet
    worker's row holding what that worker does not send (`principals.refusal`). Rows of no
    fleet worker are the schema owner's alone (a test's, a benchmark's). Pure."""
    if worker not in EMITS:
        return None
    assert isinstance(headers, Mapping)
    return _refusal(subjects, worker, headers.get(TYPE_HEADER), subject)


@functools.lru_cache(maxsize=4096)
def _refusal(subjects: Subjects, worker: str, bc_type: str | None, subject: str) -> str | None:
    """`principals.refusal`, remembered (a relay sees the same few a thousand times); its
    arguments are strings, checked before (`header_refusal`)."""
    return refusal(subjects, worker, bc_type, subject)


#: words of an error answer that say the server (or the account) is short of room, not
#: that the message is wrong: an outage every row would meet, never counted against one
SHORT_OF_ROOM = ("resource", "storage", "exceeded", "insufficient", "limit")


def refused(failure: BaseException) -> bool:
    """Whether the server answered one message with an error of its own, counted against
    its row (`REFUSALS`) — not an outage (no answer, no stream, 503, 408, 429, the account
    or the server short of room: `SHORT_OF_ROOM`). Pure."""
    if not isinstance(failure, nats.js.errors.APIError):
        return False
    if isinstance(failure, nats.js.errors.ServiceUnavailableError):
        return False
    said = (failure.description or "").lower()
    return (failure.code or 0) not in (408, 429, 503) and not any(w in said for w in SHORT_OF_ROOM)
