"""Poison refused at validation: every value PostgreSQL would refuse inside a batch's
transaction — a NUL, an age beyond its date range, a timestamp without a time zone, an
integer beyond its column — is refused by the schema, so the fact is dead-lettered
`invalid` before any transaction and no batch is split to find it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas import REGISTRY, InvalidMessage
from schemas.facts import AGE_MS_MAX
from tests.factories import WIRE_SAMPLES


def _sample(bc_type: str, **changes: Any) -> dict[str, Any]:
    return {**json.loads(json.dumps(WIRE_SAMPLES[bc_type], default=str)), **changes}


def _decode(bc_type: str, body: dict[str, Any]) -> Any:
    return REGISTRY.decode({"Bc-Type": bc_type}, json.dumps(body).encode())


NUL = "a\u0000b"


# one case a row, read down its columns: kept out of the formatter (fmt: skip)
@pytest.mark.parametrize(
    ("bc_type", "body", "field"),
    [
        pytest.param("hello", _sample("hello", boot_id=NUL), "boot_id", id="nul-in-an-id"),
        pytest.param("hello", _sample("hello", inventory_hashes={"cpu": NUL}), "inventory_hashes.cpu", id="nul-in-a-map-value"),
        pytest.param("result", _sample("result", error=NUL), "error", id="nul-in-an-error"),
        pytest.param("result", _sample("result", result={"out": ["x", NUL]}), "result.out.1", id="nul-deep-in-json"),
        pytest.param("result", _sample("result", result={NUL: 1}), "result.a?b", id="nul-in-a-json-key"),
        pytest.param("events", _sample("events", events=[{**WIRE_SAMPLES["events"]["events"][0], "kind": NUL}]), "events.0.kind", id="nul-in-an-event"),
        pytest.param("dispatch", _sample("dispatch", payload={"argv": [NUL]}), "payload.argv.0", id="nul-in-a-notice"),
        pytest.param("liveness", _sample("liveness", entries=[{"node_id": "n", "epoch": 1, "age_ms": AGE_MS_MAX + 1}]), "entries.0.age_ms", id="age-beyond-the-date-range"),
        pytest.param("result", _sample("result", observed_at="2026-11-30T00:00:00"), "observed_at", id="naive-observed-at"),
        pytest.param("hello", _sample("hello", process_started_at="2026-11-30T00:00:00"), "process_started_at", id="naive-process-start"),
        pytest.param("events", _sample("events", events=[{**WIRE_SAMPLES["events"]["events"][0], "at": "2026-11-30T00:00:00"}]), "events.0.at", id="naive-event-time"),
        pytest.param("result", _sample("result", epoch=2**63), "epoch", id="epoch-beyond-bigint"),
        pytest.param("result", _sample("result", result={"ratio": float("nan")}), "result.ratio", id="nan-in-json"),
        pytest.param("events", _sample("events", events=[{**WIRE_SAMPLES["events"]["events"][0], "body": {"t": [1, float("inf")]}}]), "events.0.body.t.1", id="infinity-deep-in-an-event"),
        pytest.param("dispatch", _sample("dispatch", payload={"x": float("-inf")}), "payload.x", id="minus-infinity-in-a-notice"),
    ],
)  # fmt: skip
def test_a_value_postgresql_would_refuse_is_refused_by_validation(
    bc_type: str, body: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidMessage) as refused:
        _decode(bc_type, body)
    assert refused.value.field == field
    assert "\x00" not in refused.value.reason  # it travels in a dead letter's header


# one case a row, read down its columns: kept out of the formatter (fmt: skip)
@pytest.mark.parametrize(
    ("bc_type", "body"),
    [
        pytest.param("hello", _sample("hello", capabilities=[NUL, "nvml"]), id="raw-capabilities-never-refuse-a-hello"),
        pytest.param("result", _sample("result", error="x" * 4096), id="a-long-genuine-error"),
        pytest.param("result", _sample("result", error="a\\u0000b as text"), id="an-escaped-backslash-is-no-nul"),
        pytest.param("liveness", _sample("liveness", entries=[{"node_id": "n", "epoch": 1, "age_ms": AGE_MS_MAX}]), id="the-oldest-age"),
        pytest.param("result", _sample("result", observed_at="2026-11-30T00:00:00+02:00"), id="an-offset-is-a-zone"),
        pytest.param("result", _sample("result", result={"big": 1e308, "text": "NaN Infinity 1e999"}), id="finite-numbers-and-such-text"),
    ],
)  # fmt: skip
def test_what_postgresql_stores_passes(bc_type: str, body: dict[str, Any]) -> None:
    _decode(bc_type, body)


def test_an_exponent_too_large_for_a_float_is_refused() -> None:
    """`1e999` parses as infinity: no `jsonb` stores it."""
    body = json.dumps(_sample("result", result={"x": 12345})).replace("12345", "1e999")
    with pytest.raises(InvalidMessage) as refused:
        REGISTRY.decode({"Bc-Type": "result"}, body.encode())
    assert refused.value.field == "result.x" and "not finite" in str(refused.value)


def test_only_a_value_that_may_not_be_finite_has_the_body_walked() -> None:
    """The cheap search that decides whether a body is walked for non-finite numbers
    finds every such value where it starts, and no fact id's hex or text."""
    from schemas.registry import _maybe_not_finite

    for body in (
        b'{"x": 1e999}',
        b'{"x":[1,-Infinity]}',
        b'{"a":NaN}',
        b'{"a": 1.5E+0400}',
        b'{"a":\n -12.E0999}',
        b'{"x": ' + b"1" * 300 + b"e999}",
    ):
        assert _maybe_not_finite(body), body
    for body in (
        b'{"fact_id":"9e123456-4e12-4e99-8e77-1e0000000000"}',
        b'{"t":"x:1e9"}',
        b'{"n": 12e99, "m": 0.5e-300}',
    ):
        assert not _maybe_not_finite(body), body


_NOT_FINITE = (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1E+400")
#: a flush with every field a heartbeat adds (the wire sample has none)
_HEARTBEAT_FLUSH = _sample(
    "liveness",
    entries=[
        {
            "node_id": "n",
            "epoch": 1,
            "age_ms": 5,
            "credits": {"default": 4},
            "load": 0.5,
            "node_load": {
                "load_average": 0.5,
                "memory_available_bytes": 8,
                "running_commands": 0,
                "pending_events": 0,
            },
        }
    ],
)


def _numbers(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every number in a decoded JSON value."""
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in _numbers(item, (*path, key))]
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in _numbers(item, (*path, index))]
    return [path] if isinstance(value, int | float) and not isinstance(value, bool) else []


def _with(body: Any, path: tuple[Any, ...], token: bytes) -> bytes:
    body = json.loads(json.dumps(body))
    *parents, last = path
    place = body
    for key in parents:
        place = place[key]
    place[last] = "\x01marker"
    return json.dumps(body).encode().replace(b'"\\u0001marker"', token)


def test_a_body_not_searched_for_non_finite_numbers_is_refused_one_by_its_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A model whose numbers all refuse NaN and the infinities is not searched for them
    (a flush's search cost a sixth of its decode): every number of its samples, made
    NaN, ±Infinity or too large for a float, is refused by validation alone."""
    from schemas import registry

    monkeypatch.setattr(registry, "_maybe_not_finite", lambda body: pytest.fail("searched"))
    samples = [(t, b) for t, b in WIRE_SAMPLES.items()] + [("liveness", _HEARTBEAT_FLUSH)]
    tried = set()
    for bc_type, body in samples:
        model = REGISTRY.model_for({"Bc-Type": bc_type})
        if registry.may_hold_not_finite(model):
            continue
        for path in _numbers(body):
            for token in _NOT_FINITE:
                with pytest.raises(InvalidMessage):
                    REGISTRY.decode({"Bc-Type": bc_type}, _with(body, path, token))
                tried.add((bc_type, path[-1]))
    assert {("liveness", "load"), ("liveness", "load_average"), ("liveness", "age_ms")} <= tried


def test_a_model_that_can_hold_a_number_not_finite_is_searched() -> None:
    """Any field (`dict[str, Any]`) or a float left to allow them keeps the search."""
    from schemas.events import GatewayBlind
    from schemas.facts import Liveness, Result
    from schemas.registry import may_hold_not_finite

    assert may_hold_not_finite(Result)  # its result: any JSON
    assert may_hold_not_finite(GatewayBlind)  # a float without allow_inf_nan=False
    assert not may_hold_not_finite(Liveness)
