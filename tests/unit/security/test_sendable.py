"""What a relay may send of an outbox row (issue #59, finding 5: a pack whose `Bc-Type` was
a list stopped the relay's every round; a `Nats-Rollup` header was retried for ever), and
what it checks at start (finding 6: only the streams its principal may read)."""

from __future__ import annotations

import json
from typing import Any

import nats.js.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import REGISTRY
from schemas.events import CapabilitiesChanged
from schemas.subjects import Subjects
from workers.registry import WORKER_NAMES
from workers.runtime.bus import principals, sendable

SUBJECTS = Subjects("bc")
GENUINE = CapabilitiesChanged(node_id="n1", epoch=1, added=["gpu"], removed=[])
EVENT = SUBJECTS.event("node.capabilities-changed")


def _headers() -> dict[str, str]:
    return REGISTRY.encode(GENUINE)[1]


def test_what_a_worker_writes_goes_out() -> None:
    traced = {
        **_headers(),
        "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
        "tracestate": "k=v",
        "baggage": "a=b",
    }
    for headers in (_headers(), traced):
        assert sendable.row_refusal(SUBJECTS, "labeler", headers, EVENT) is None
        stored = json.dumps(headers)
        assert sendable.read_headers(stored, sendable.allowed()) == (headers, None)
        read, _ = sendable.read_headers(stored)
        read["Nats-Msg-Id"] = "x"  # the relay adds to what it read: a dict of its own
        assert sendable.read_headers(stored) == (headers, None)


def test_headers_shared_by_rows_are_checked_as_each_row_is() -> None:
    """Untraced rows share their text; the check of it is remembered, not its verdict's
    absence: a refused text is refused every time."""
    text = json.dumps({**_headers(), "Nats-Rollup": "all"})
    for _ in range(3):
        assert sendable.read_headers(text)[1] == "header 'Nats-Rollup' is not one a worker sends"


@given(
    value=st.one_of(
        st.lists(st.text(max_size=3)),
        st.dictionaries(st.text(max_size=3), st.integers()),
        st.integers(),
        st.floats(allow_nan=False),
        st.booleans(),
        st.none(),
    ),
    name=st.sampled_from(sorted(sendable.HEADERS)),
    worker=st.sampled_from([*WORKER_NAMES, None, "tally"]),
)
def test_a_value_that_is_no_string_is_refused_never_raised(
    value: Any, name: str, worker: str | None
) -> None:
    """A list (unhashable: it raised TypeError out of the round) or any other JSON that is
    no string, in any allowed header, of any worker's row or none's."""
    headers = {**_headers(), name: value}
    why = sendable.row_refusal(SUBJECTS, worker, headers, EVENT)
    assert why == f"header {name} is not a string ({type(value).__name__})"


@given(name=st.text(min_size=1, max_size=500))
def test_a_header_a_worker_does_not_write_is_refused(name: str) -> None:
    headers = {name: "all", **_headers()}  # a header the worker writes keeps its value
    why = sendable.row_refusal(SUBJECTS, "labeler", headers, EVENT)
    if name in sendable.HEADERS or name.lower() in sendable.PROPAGATION:
        assert why is None
    else:
        assert why is not None and why.startswith("header ") and "is not one a worker sends" in why
        assert len(why) < 64 * 10 + 40  # a name of any length is shown cut


def test_a_context_of_any_standard_propagator_goes_out_whatever_the_relay_runs() -> None:
    """A worker run with `OTEL_PROPAGATORS=b3multi` (or jaeger, or xray) writes its trace
    context in those headers; a relay run with the default propagator still sends it."""
    for name in ("X-B3-TraceId", "x-b3-spanid", "b3", "uber-trace-id", "X-Amzn-Trace-Id"):
        assert sendable.row_refusal(SUBJECTS, "labeler", {**_headers(), name: "1-2"}, EVENT) is None
    why = sendable.row_refusal(SUBJECTS, "labeler", {**_headers(), "x-b3-evil": "1"}, EVENT)
    assert why == "header 'x-b3-evil' is not one a worker sends"


def test_no_nats_header_is_ever_allowed() -> None:
    """What the server reads: a rollup (purges the stream's subject), expectations, a TTL."""
    for name in (
        "Nats-Rollup",
        "Nats-Expected-Last-Sequence",
        "Nats-TTL",
        "Nats-Msg-Id",
        "Nats-Expected-Stream",
        "nats-rollup",
    ):
        assert name not in sendable.allowed()
        why = sendable.row_refusal(SUBJECTS, "replay", {**_headers(), name: "all"}, EVENT)
        assert why == f"header {name!r} is not one a worker sends"
    assert sendable.allowed() >= sendable.HEADERS


@given(st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=20))
def test_a_value_with_a_control_character_is_refused(text: str) -> None:
    for cut in ("\r\nNats-Rollup: all", "\n", "\x00", "\x7f"):
        value = text + cut
        why = sendable.header_refusal({"Bc-Type": value})
        assert why == "header Bc-Type holds a character that is not printable"


def test_a_value_too_long_is_refused() -> None:
    assert sendable.header_refusal({"tracestate": "x" * sendable.MAX_VALUE}) is None
    why = sendable.header_refusal({"tracestate": "x" * (sendable.MAX_VALUE + 1)})
    assert why == f"header tracestate is {sendable.MAX_VALUE + 1} characters long (at most 8192)"


def test_headers_nested_past_the_parser_or_too_long_raise_what_the_relay_buries() -> None:
    """A RecursionError out of the JSON parser ended the relay's round for every row (a
    worker's login planted `"baggage": [[[[…]]]]`): it is a ValueError now, which the
    relay buries with its row, traced or not; so is text longer than any outbox writes."""
    nested = '{"Bc-Type": "node.capabilities-changed", "baggage": ' + "[" * 3000 + "]" * 3000 + "}"
    for text in (nested, nested.replace("baggage", "traceparent")):
        with pytest.raises(ValueError, match="nested too deep"):
            sendable.read_headers(text)
    long = json.dumps({"Bc-Type": "x", "baggage": "y" * sendable.MAX_TEXT})
    with pytest.raises(ValueError, match="characters"):
        sendable.read_headers(long)


def test_headers_that_are_not_a_map_are_refused() -> None:
    for headers in ([], ["traceparent"], "x", 1, None):
        assert sendable.header_refusal(headers) == "its headers are not a map"


def test_what_the_server_refuses_of_one_message_counts_an_outage_does_not() -> None:
    rollup = nats.js.errors.ServerError(code=500, err_code=10115, description="rollup failed")
    assert sendable.refused(rollup)
    assert sendable.refused(nats.js.errors.APIError(code=500))
    for outage in (
        nats.js.errors.ServiceUnavailableError(code=503, description="unavailable"),
        nats.js.errors.APIError(code=503),
        nats.js.errors.APIError(code=429),
        nats.js.errors.APIError(code=408),
        nats.js.errors.NoStreamResponseError(),
        TimeoutError("no PubAck in time"),
        # the account or the server short of room: every row would meet it
        nats.js.errors.BadRequestError(
            code=400, err_code=10002, description="resource limits exceeded for account"
        ),
        nats.js.errors.ServerError(
            code=500, err_code=10047, description="insufficient storage resources available"
        ),
        nats.js.errors.APIError(code=503, description="maximum messages exceeded"),
    ):
        assert not sendable.refused(outage), outage


def test_the_relay_checks_at_start_only_the_streams_its_principal_may_read() -> None:
    """Finding 6: with each gateway's own facts stream, `bcw run relay` checked every stream
    and its principal had no `STREAM.INFO` on `BC_FACTS_<gw>`: it never started."""
    relay = next(p for p in principals.principals(SUBJECTS, ["gw-1"]) if p.name == "relay")
    readable = {g.removeprefix("$JS.API.STREAM.INFO.") for g in relay.publish if "STREAM.INFO" in g}
    # and the old dead stream, which a relay of an older release checks at start
    assert readable == {*principals.relay_streams(SUBJECTS), SUBJECTS.dead_stream}
    assert SUBJECTS.facts_stream not in readable  # it publishes no fact
