"""The bus contract: every message round-trips with DESIGN §3's field names, and bad
input of every kind is refused with an error that names the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import (
    REGISTRY,
    Hello,
    InvalidMessage,
    MessageError,
    NodeConnected,
    SubjectError,
    Subjects,
    UnknownMessageType,
)
from schemas.events import EVENT_TYPES
from schemas.subjects import split_gateway_subject
from tests.factories import WIRE_SAMPLES, hello_wire
from workers.runtime.bus import principals, streams

# The field names of DESIGN §3, spelled out by hand so that a rename is caught here.
# One message type a row, as DESIGN lists them: kept out of the formatter (fmt: skip).
DESIGN_FIELDS: dict[str, set[str]] = {
    "hello": {
        "fact_id", "gateway_id", "observed_at", "node_id", "session_id", "epoch", "role",
        "boot_id", "journal_id", "daemon_version", "proto_max", "trust_version",
        "capabilities", "approver_set_epoch", "approver_set_sha256", "running_command_ids",
        "inventory_hashes", "cert", "upgrade_required", "transport", "previous",
        "process_started_at",  # DESIGN §9: the proof of a restart (optional)
        "results",  # DESIGN §10: done results not acked yet (optional)
        "duplicate", "proven", "proof",  # DESIGN §11: the Hello transaction's word, the proof
    },
    "liveness": {"fact_id", "gateway_id", "observed_at", "entries", "range_start", "range_end"},
    "closed": {"fact_id", "gateway_id", "observed_at", "node_id", "epoch", "reason", "code"},
    "progress": {"fact_id", "gateway_id", "observed_at", "node_id", "epoch", "command_id", "state"},
    "result": {
        "fact_id", "gateway_id", "observed_at", "node_id", "epoch", "command_id", "outcome",
        "result", "error",
    },
    "rejected": {"fact_id", "gateway_id", "observed_at", "node_id", "epoch", "command_id", "reason"},
    "events": {"fact_id", "gateway_id", "observed_at", "node_id", "journal_id", "events"},
    "status": {
        "fact_id", "gateway_id", "observed_at", "node_id", "epoch", "observed_generation",
        "trust_version", "approver_set_epoch", "approver_set_sha256",
    },
    "node.connected": {
        "nodeId", "epoch", "gatewayId", "bootId", "journalChanged", "bootChanged",
        "duplicateIdentity",
    },
    "node.disconnected": {"nodeId", "epoch", "gatewayId", "reason", "code"},
    "node.capabilities-changed": {"nodeId", "epoch", "added", "removed"},
    "security.node.duplicate-session": {
        "nodeId", "gatewayId", "previousBootId", "bootId", "alternations", "windowSeconds",
        "quarantined", "held",
    },
    "security.node.unproven-hello": {"nodeId", "gatewayId", "epoch", "bootId", "serial"},
    "security.node.quarantined": {"nodeId", "reason", "alternations", "revokedSerials"},
    "security.quarantine.held": {
        "nodeId", "gatewayId", "reason", "alternations", "gateways", "serials",
    },
    "security.quarantine.breaker-open": {"gatewayId", "revoked", "windowSeconds"},
    "security.node.hold-expired": {"nodeId", "epoch", "gatewayId", "heldSeconds"},
    **{
        name: {"commandId", "nodeId", "epoch", "seq", "kind", "attempt", "reason"}
        for name in ("command.replayed", "command.cancelled", "command.failed", "command.completed")
    },
    # DESIGN §9: the names shared across the second-round issues
    "gateway.blind": {"gatewayId", "sessions", "lastFlushAgeSeconds", "reason"},
    "gateway.seeing": {"gatewayId", "sessions", "lastFlushAgeSeconds"},
    "liveness.breaker-open": {"gatewayId", "wouldDisconnect", "connected"},
    "revocations": {"nodeId", "serials", "reason"},
    "dispatch": {
        "node_id", "epoch", "command_id", "seq", "kind", "lane", "attempt", "payload", "signature",
    },
    "zombie": {"node_id", "epoch"},
    "event-ack": {"node_id", "journal_id", "seq"},
    "hello-again": {"node_id", "epoch"},
}  # fmt: skip
#: every event says when its fact happened (issue 60, item 7; docs/contract.md, "When it
#: happened"): these two by name, the others as `at`
EVENT_TIMES = {"node.connected": "connectedAt", "node.disconnected": "disconnectedAt"}
for _event in EVENT_TYPES:
    DESIGN_FIELDS[_event.BC_TYPE].add(EVENT_TIMES.get(_event.BC_TYPE, "at"))


def _decode(bc_type: str, body: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return REGISTRY.decode({"Bc-Type": bc_type, "Bc-Schema": "1"}, raw)


def test_every_registered_type_has_a_sample_and_design_fields() -> None:
    registered = {bc_type for bc_type, _ in REGISTRY.models}
    assert registered == set(WIRE_SAMPLES) == set(DESIGN_FIELDS)


@pytest.mark.parametrize("bc_type", sorted(WIRE_SAMPLES))
def test_round_trip_keeps_the_wire_field_names(bc_type: str) -> None:
    message = _decode(bc_type, WIRE_SAMPLES[bc_type])
    body, headers = REGISTRY.encode(message)
    assert headers == {"Bc-Type": bc_type, "Bc-Schema": "1"}
    wire = json.loads(body)
    assert set(wire) == DESIGN_FIELDS[bc_type]
    assert _decode(bc_type, body) == message
    # the sample's values survive (datetimes and UUIDs are re-rendered, compare decoded)
    assert _decode(bc_type, wire) == _decode(bc_type, WIRE_SAMPLES[bc_type])


def test_events_are_snake_case_in_python() -> None:
    event = NodeConnected(
        node_id="n",
        epoch=1,
        gateway_id="g",
        boot_id="b",
        journal_changed=False,
        boot_changed=False,
        duplicate_identity=False,
    )
    assert json.loads(REGISTRY.encode(event)[0])["nodeId"] == "n"
    assert event.node_id == "n"


@pytest.mark.parametrize(
    ("previous", "boot_id", "journal_id", "expected"),
    [
        pytest.param(
            {"epoch": 0, "live": False}, "b", "j", (False, False, False), id="first-hello"
        ),
        pytest.param(
            {"epoch": 1, "boot_id": "b", "journal_id": "j", "live": True},
            "b",
            "j",
            (False, False, False),
            id="same-boot-reconnect",
        ),
        pytest.param(
            {"epoch": 1, "boot_id": "a", "journal_id": "j", "live": False},
            "b",
            "j",
            (False, True, False),
            id="reboot",
        ),
        pytest.param(
            {"epoch": 1, "boot_id": "a", "journal_id": "i", "live": False},
            "b",
            "j",
            (True, True, False),
            id="reinstall",
        ),
        pytest.param(
            {"epoch": 1, "boot_id": "a", "journal_id": "j", "live": True},
            "b",
            "j",
            (False, True, True),
            id="clone-while-live",
        ),
        pytest.param(
            {"epoch": 1, "boot_id": None, "journal_id": None, "live": True},
            "b",
            "j",
            (False, False, False),
            id="live-but-no-previous-boot",
        ),
    ],
)
def test_hello_derived_flags(
    previous: dict[str, Any], boot_id: str, journal_id: str, expected: tuple[bool, bool, bool]
) -> None:
    hello = _decode("hello", hello_wire(previous=previous, boot_id=boot_id, journal_id=journal_id))
    assert isinstance(hello, Hello)
    assert (hello.journal_changed, hello.boot_changed, hello.duplicate_identity) == expected


@pytest.mark.parametrize(
    ("bc_type", "body", "field"),
    [
        pytest.param("hello", hello_wire(epoch="2"), "epoch", id="wrong-type"),
        pytest.param("hello", hello_wire(epoch=0), "epoch", id="epoch-zero"),
        pytest.param(
            "hello",
            {k: v for k, v in hello_wire().items() if k != "boot_id"},
            "boot_id",
            id="missing-field",
        ),
        pytest.param("hello", hello_wire(gateway_id="gw.1"), "gateway_id", id="gateway-dot"),
        pytest.param("hello", hello_wire(gateway_id="gw>"), "gateway_id", id="gateway-wildcard"),
        pytest.param("hello", hello_wire(gateway_id="g" * 65), "gateway_id", id="gateway-too-long"),
        pytest.param("hello", hello_wire(gateway_id=""), "gateway_id", id="gateway-empty"),
        pytest.param("hello", hello_wire(transport="carrier-pigeon"), "transport", id="bad-enum"),
        pytest.param("hello", hello_wire(fact_id="not-a-uuid"), "fact_id", id="bad-uuid"),
        pytest.param(
            "hello", hello_wire(capabilities=[1, 2]), "capabilities.0", id="capability-not-a-string"
        ),
        pytest.param(
            "hello",
            hello_wire(previous={"epoch": 1, "boot_id": 3}),
            "previous.boot_id",
            id="nested-wrong-type",
        ),
        pytest.param(
            "liveness",
            {
                **WIRE_SAMPLES["liveness"],
                "entries": [{"node_id": "n", "epoch": 1, "age_ms": 0}] * 10_001,
            },
            "entries",
            id="liveness-over-10000",
        ),
        pytest.param(
            "liveness",
            {**WIRE_SAMPLES["liveness"], "entries": [{"node_id": "n", "epoch": 1, "age_ms": -1}]},
            "entries.0.age_ms",
            id="negative-age",
        ),
        pytest.param(
            "closed", {**WIRE_SAMPLES["closed"], "reason": "bored"}, "reason", id="bad-reason"
        ),
        pytest.param(
            "status",
            {**WIRE_SAMPLES["status"], "approver_set_sha256": "XYZ"},
            "approver_set_sha256",
            id="bad-digest",
        ),
        pytest.param(
            "events", {**WIRE_SAMPLES["events"], "events": []}, "events", id="empty-events"
        ),
        pytest.param(
            "node.connected",
            {**WIRE_SAMPLES["node.connected"], "nodeId": 5},
            "nodeId",
            id="event-wrong-type",
        ),
        pytest.param(
            "zombie",
            {"node_id": "node 1", "epoch": 1},
            "node_id",
            id="node-id-with-space",
        ),
    ],
)
def test_invalid_input_names_the_field(bc_type: str, body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        _decode(bc_type, body)
    assert caught.value.field == field
    assert f"'{field}'" in caught.value.reason


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        pytest.param({"Bc-Type": "teleport"}, b"{}", id="unknown-type"),
        pytest.param({}, b"{}", id="no-type-header"),
        pytest.param(None, b"{}", id="no-headers"),
        pytest.param({"Bc-Type": "hello", "Bc-Schema": "2"}, b"{}", id="unknown-version"),
        pytest.param({"Bc-Type": "hello", "Bc-Schema": "one"}, b"{}", id="version-not-int"),
    ],
)
def test_unknown_types_are_refused(headers: dict[str, str] | None, body: bytes) -> None:
    with pytest.raises(UnknownMessageType):
        REGISTRY.decode(headers, body)


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1, 2]", b"", b"\xff\xfe", b"null", b'{"fact_id": ' + b"9" * 5000 + b"}"],
)
def test_garbage_bodies_raise_message_error_only(body: bytes) -> None:
    with pytest.raises(MessageError):
        REGISTRY.decode({"Bc-Type": "hello"}, body)


def test_decode_fact_refuses_an_event() -> None:
    body = json.dumps(WIRE_SAMPLES["zombie"]).encode()
    with pytest.raises(UnknownMessageType):
        REGISTRY.decode_fact({"Bc-Type": "zombie"}, body)


def test_subjects_and_streams_follow_the_root() -> None:
    names = Subjects("t1")
    assert names.facts_stream == "T1_FACTS"
    assert names.fact("gw-1", "hello") == "t1.facts.gw-1.hello"
    assert names.parse_fact("t1.facts.gw-1.hello") == ("gw-1", "hello")
    assert names.notice("gw-1", "dispatch") == "t1.gw.gw-1.dispatch"
    assert names.dead("liveness") == "t1.dead.liveness"
    assert Subjects().events_stream == "BC_EVENTS"


@pytest.mark.parametrize(
    "subject", ["t1.facts.gw-1", "t2.facts.gw.hello", "t1.events.gw.hello", "t1.facts.g*.x"]
)
def test_parse_fact_refuses_other_shapes(subject: str) -> None:
    for _ in range(2):  # every time: a refusal is never remembered as an answer
        with pytest.raises(SubjectError):
            Subjects("t1").parse_fact(subject)
    assert Subjects("t2").parse_fact("t2.facts.gw.hello") == ("gw", "hello")  # its own root


@pytest.mark.parametrize(
    ("subject", "split"),
    [
        ("bc.facts.gw-1.hello", ("facts", "gw-1", "hello")),
        ("t1.gw.gw-2.dispatch", ("gw", "gw-2", "dispatch")),
        ("bc.events.node.connected", None),
        ("bc.revocations", None),
        ("bc.gw.x", None),
    ],
)
def test_gateway_subjects_split_into_kind_gateway_and_type(
    subject: str, split: tuple[str, str, str] | None
) -> None:
    assert split_gateway_subject(subject) == split


@pytest.mark.parametrize("root", ["", "a.b", "a*", "x" * 33])
def test_bad_roots_are_refused(root: str) -> None:
    with pytest.raises(SubjectError):
        Subjects(root)


def test_capabilities_never_refuse_a_hello() -> None:
    """Any list of strings the bus can carry: the labeler keeps the valid names."""
    wire = hello_wire(capabilities=[f"c{i}" for i in range(2000)] + ["x" * 300, "", "Not Valid"])
    hello = REGISTRY.decode({"Bc-Type": "hello"}, json.dumps(wire).encode())
    assert len(hello.capabilities) == 2003


TOKENS = ["t1", "t2", "facts", "events", "gw", "dead", "revocations", "gw-1", "x"]


@given(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=5))
def test_stream_of_names_the_stream_whose_subjects_match(tokens: list[str]) -> None:
    """`Subjects.stream_of` (the relay's grouping into fast batches) agrees with the
    subjects the contract's streams are configured with, for any subject (each token a
    publisher of dead letters, with its own dead stream)."""
    subjects = Subjects("t1")
    subject = ".".join(tokens)
    limits = streams.StreamLimits(dead_publishers=tuple(TOKENS))
    holding = [
        config.name
        for config in streams.stream_configs(subjects, 1, limits)
        if any(principals.matches(pattern, subject) for pattern in config.subjects or ())
    ]
    assert len(holding) <= 1
    assert subjects.stream_of(subject) == (holding[0] if holding else None)


@pytest.mark.parametrize("event", EVENT_TYPES, ids=lambda t: t.BC_TYPE)
def test_every_event_says_when_its_fact_happened_and_reads_one_that_does_not(
    event: type[Any],
) -> None:
    name = EVENT_TIMES.get(event.BC_TYPE, "at")
    sample = {k: v for k, v in WIRE_SAMPLES[event.BC_TYPE].items() if k != name}
    # as a worker before 0.4 says it: no time, read as None (and said as null)
    assert getattr(_decode(event.BC_TYPE, sample), _snake(name)) is None
    timed = _decode(event.BC_TYPE, {**sample, name: "2026-12-05T05:47:55.5+01:00"})
    body, _ = REGISTRY.encode(timed)
    assert json.loads(body)[name] == "2026-12-05T05:47:55.500000+01:00"
    # an aware time only: a time without its offset is refused, not taken for local
    with pytest.raises(InvalidMessage):
        _decode(event.BC_TYPE, {**sample, name: "2026-12-05T05:47:55"})


def _snake(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
