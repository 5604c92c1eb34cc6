"""The tolerant contract (docs/contract.md, "Compatibility"): every reader ignores fields
it does not know, in facts, events and notices alike; `Bc-Schema` is the major version;
the exported JSON Schemas allow what a later minor adds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg

from schemas import REGISTRY, UnknownMessageType, UnsupportedMajor
from schemas.export import json_schemas
from schemas.subjects import Subjects
from tests.factories import WIRE_SAMPLES
from workers.runtime.effects import items
from workers.runtime.effects.outcome import Kind
from workers.runtime.effects.worker import Worker

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3)
    ),
    max_leaves=8,
)


def _decode(bc_type: str, body: dict[str, Any], schema: str = "1") -> Any:
    return REGISTRY.decode({"Bc-Type": bc_type, "Bc-Schema": schema}, json.dumps(body).encode())


@pytest.mark.parametrize("bc_type", sorted(WIRE_SAMPLES))
@given(extra=st.dictionaries(st.text(min_size=1), JSON, min_size=1, max_size=4))
def test_unknown_fields_take_no_effect_in_every_message(
    bc_type: str, extra: dict[str, Any]
) -> None:
    sample = WIRE_SAMPLES[bc_type]
    model = REGISTRY.model_for({"Bc-Type": bc_type})
    known = {field.alias or name for name, field in model.model_fields.items()} | set(
        model.model_fields
    )
    unknown = {k: v for k, v in extra.items() if k not in known}
    message = _decode(bc_type, {**json.loads(json.dumps(sample, default=str)), **unknown})
    assert message == _decode(bc_type, json.loads(json.dumps(sample, default=str)))
    # and re-encoding sends only what this release knows
    assert not set(unknown) & set(json.loads(REGISTRY.encode(message)[0]))


@pytest.mark.parametrize(
    ("bc_type", "path"),
    [
        ("hello", ("cert",)),
        ("hello", ("previous",)),
        ("liveness", ("entries", 0)),
        ("events", ("events", 0)),
    ],
)
def test_unknown_fields_in_nested_objects_take_no_effect(
    bc_type: str, path: tuple[str | int, ...]
) -> None:
    body = json.loads(json.dumps(WIRE_SAMPLES[bc_type], default=str))
    inner = body
    for step in path:
        inner = inner[step]
    inner["added_later"] = {"x": 1}
    assert _decode(bc_type, body) == _decode(
        bc_type, json.loads(json.dumps(WIRE_SAMPLES[bc_type], default=str))
    )


@pytest.mark.parametrize("schema", ["1", "1.0", "1.4", " 1 ", "1.999999"])
def test_the_major_is_what_a_reader_checks(schema: str) -> None:
    body = json.loads(json.dumps(WIRE_SAMPLES["status"], default=str))
    assert _decode("status", body, schema) == _decode("status", body)


def test_a_major_this_release_does_not_speak_is_named_as_such() -> None:
    with pytest.raises(UnsupportedMajor) as caught:
        _decode("hello", {}, "2")
    assert (caught.value.bc_type, caught.value.major, caught.value.spoken) == ("hello", 2, (1,))
    assert caught.value.reason == "hello schema major 2 is not spoken here (this release speaks 1)"


@pytest.mark.parametrize("schema", ["", "one", "0", "01", "-1", "1.x", "1.2.3", "2 .1"])
def test_a_schema_header_that_is_no_version_is_refused_as_unknown(schema: str) -> None:
    with pytest.raises(UnknownMessageType) as caught:
        _decode("hello", {}, schema)
    assert not isinstance(caught.value, UnsupportedMajor)


def test_no_exported_schema_closes_an_object() -> None:
    def closed(node: Any) -> bool:
        if isinstance(node, dict):
            if node.get("additionalProperties") is False:
                return True
            return any(closed(value) for value in node.values())
        if isinstance(node, list):
            return any(closed(value) for value in node)
        return False

    assert [name for name, schema in json_schemas().items() if closed(schema)] == []


async def _nothing(tx: Any, facts: Any) -> dict[Any, Any]:
    return {}


@pytest.mark.parametrize(("schema", "cause"), [("2", "unsupported-major"), ("x", "invalid")])
def test_the_consumer_parks_an_unspoken_major_apart_from_invalid_facts(
    schema: str, cause: str
) -> None:
    subjects = Subjects("t")
    body = json.dumps(json.loads(json.dumps(WIRE_SAMPLES["hello"], default=str))).encode()
    msg = Msg(
        _client=None,  # type: ignore[arg-type]
        subject=subjects.fact("gw-1", "hello"),
        data=body,
        headers={"Bc-Type": "hello", "Bc-Schema": schema},
    )
    item = items.decode(msg, subjects, Worker("labeler", ("hello",), _nothing))
    assert item.outcome is not None and item.outcome.kind is Kind.DEAD
    assert item.outcome.cause == cause
