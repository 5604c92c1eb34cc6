"""The bus as an AsyncAPI 3 document (`bcw schemas export --asyncapi FILE`): a channel per
subject of the contract, what bc-workers receives and sends on it, and each message with
its headers and the same JSON Schema as `schemas/json/` — what a team writing a gateway
or a subscriber in another language generates its client from.

Pure: built from the registry and the subject names; the committed
`schemas/asyncapi.json` is checked by a test to be up to date.
"""

from __future__ import annotations

import copy
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from schemas.events import Revocations
from schemas.export import json_schemas
from schemas.facts import Fact
from schemas.notices import NOTICE_TYPES
from schemas.registry import REGISTRY, SCHEMA_HEADER, TYPE_HEADER, Registry

ASYNCAPI_FILE = Path(__file__).parent / "asyncapi.json"
ASYNCAPI_VERSION = "3.0.0"

#: how a subscriber resumes, and what it may see twice (docs/contract.md, "Subscribing")
RESUME = (
    "Resume: keep the stream sequence of the last event handled and read on from the next "
    "(`$JS.API.STREAM.MSG.GET.BC_EVENTS` with `seq` and `next_by_subj`), or pull the durable "
    "`sub-<app>` that `bcw provision` makes (the server keeps the place; what was not acked "
    "comes again after the ack wait). No subscriber creates a consumer (no ordered consumer). "
    "Duplicates: the stream holds each event once (the relay re-publishes with the same "
    "`Nats-Msg-Id` within the duplicate window), but a subscriber may handle one twice (a "
    "restart before it kept its place, a redelivery, a core subscription): drop repeats by "
    "`Nats-Msg-Id`. Each event says when its fact happened (`connectedAt`, `disconnectedAt`, "
    "`at`; since 0.4, absent from older workers' events)."
)
_ROOT = {"default": "bc", "description": "The subject root (`BCW_SUBJECT_ROOT`)."}
_GATEWAY = {"description": "The gateway's id: `[A-Za-z0-9_-]{1,64}`, one subject token."}
#: each kind's stream (root `bc`) and what it keeps (docs/contract.md, "Streams")
STREAMS = {
    "facts": (
        "BC_FACTS",
        "24 h, a 2-minute duplicate window (with BCW_NATS_FACTS_GATEWAYS, each listed gateway's "
        "`BC_FACTS_<gateway>`, which BC_FACTS sources).",
    ),
    "events": ("BC_EVENTS", "7 days, a 2-minute duplicate window. " + RESUME),
    "revocations": ("BC_EVENTS", "7 days, beside the events (not one of them)."),
    "notices": ("BC_GATEWAY", "1 h; each gateway pulls its own durable `gw-<id>`."),
}
NKEY = {
    "type": "asymmetricEncryption",
    "description": "NATS nkey authentication (the closest AsyncAPI type; NATS calls it "
    "`nkey`): each principal holds an Ed25519 seed (`bcw auth nats` writes "
    "`<principal>.nk`) and signs the server's nonce at connect; the server knows its public "
    "key (`U…`) and its permissions (`auth.conf`). Every principal takes its replies on "
    "`_INBOX.<its public key>.>` only (nats.js `inboxPrefix`, nats.go "
    "`nats.CustomInboxPrefix`). Subscribers: `subscriber` (reads BC_EVENTS message by "
    "message, creates no consumer) and `subscriber-<app>` (also pulls its durable "
    '`sub-<app>`). docs/contract.md, "Subscribing to session events".',
}


def _headers(bc_type: str, version: int) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["Nats-Msg-Id", TYPE_HEADER, SCHEMA_HEADER],
        "properties": {
            "Nats-Msg-Id": {
                "type": "string",
                "description": "The message's id (for facts, its fact_id): JetStream keeps one copy "
                "of a re-publish within the duplicate window.",
            },
            TYPE_HEADER: {"type": "string", "const": bc_type},
            SCHEMA_HEADER: {
                "type": "string",
                "pattern": rf"^{version}(\.[0-9]+)?$",
                "description": "The major version of the schema, optionally with the "
                "producer's minor (`N` or `N.M`); readers check the major only.",
            },
            "traceparent": {"type": "string", "description": "W3C trace context, when traced."},
            "tracestate": {"type": "string"},
        },
    }


def _channel(bc_type: str, version: int) -> tuple[str, dict[str, Any], str]:
    """(channel id, channel, action of bc-workers on it) of one message type."""
    model = REGISTRY.models[(bc_type, version)]
    key = f"{bc_type}.v{version}"
    message = {"$ref": f"#/components/messages/{key}"}
    if issubclass(model, Fact):
        address, params, kind, action = (
            "{root}.facts.{gatewayId}." + bc_type,
            True,
            "facts",
            "receive",
        )
    elif model in NOTICE_TYPES:
        address, params, kind, action = "{root}.gw.{gatewayId}." + bc_type, True, "notices", "send"
    elif model is Revocations:
        address, params, kind, action = "{root}.revocations", False, "revocations", "send"
    else:
        address, params, kind, action = "{root}.events." + bc_type, False, "events", "send"
    stream, kept = STREAMS[kind]
    channel: dict[str, Any] = {
        "address": address,
        "title": f"{kind}: {bc_type}",
        "description": f"Stored in the JetStream stream `{stream}` (root `bc`; "
        f"`<ROOT>{stream[2:]}` for another root): {kept}",
        "messages": {bc_type: message},
        "parameters": {"root": _ROOT, **({"gatewayId": _GATEWAY} if params else {})},
        "x-bc-stream": stream,
    }
    return f"{kind}.{bc_type}", channel, action


def _rehome(schema: dict[str, Any], key: str, out: dict[str, Any]) -> dict[str, Any]:
    """`schema` with its `$defs` moved to `out` as `<key>.<Name>` and every `$ref` pointed
    there (a `$ref` inside an AsyncAPI document resolves against the document)."""
    schema = copy.deepcopy(schema)
    for name, definition in schema.pop("$defs", {}).items():
        out[f"{key}.{name}"] = definition
    schema.pop("$id", None)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                node["$ref"] = f"#/components/schemas/{key}.{ref.removeprefix('#/$defs/')}"
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    walk(out)
    return schema


def document(registry: Registry = REGISTRY) -> dict[str, Any]:
    """The AsyncAPI 3 document of the bus."""
    schemas: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    exported = json_schemas(registry)
    for bc_type, version in sorted(registry.models):
        key = f"{bc_type}.v{version}"
        model = registry.models[(bc_type, version)]
        schemas[key] = _rehome(exported[f"{key}.json"], key, schemas)
        messages[key] = {
            "name": bc_type,
            "title": bc_type,
            "summary": (model.__doc__ or bc_type).strip().splitlines()[0],
            "contentType": "application/json",
            "headers": _headers(bc_type, version),
            "payload": {"$ref": f"#/components/schemas/{key}"},
        }
        channel_id, channel, action = _channel(bc_type, version)
        channels[channel_id] = channel
        operations[f"{action}.{channel_id}"] = {
            "action": action,
            "channel": {"$ref": f"#/channels/{channel_id}"},
            "messages": [{"$ref": f"#/channels/{channel_id}/messages/{bc_type}"}],
        }
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "bc-workers bus",
            "version": _version(),
            "description": "Facts from gateways to the workers, session events to subscribers, "
            "notices to one gateway, revocations to every gateway, on NATS JetStream. Readers "
            "ignore fields they do not know; `Bc-Schema` is the major version "
            "(docs/contract.md, Compatibility). " + RESUME,
            "license": {"name": "Apache-2.0"},
        },
        "defaultContentType": "application/json",
        "servers": {
            "nats": {
                "host": "localhost:4222",
                "protocol": "nats",
                "description": "Any NATS 2.10+ server or cluster with JetStream.",
                "security": [{"$ref": "#/components/securitySchemes/nkey"}],
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {
            "messages": messages,
            "schemas": schemas,
            "securitySchemes": {"nkey": NKEY},
        },
    }


def _version() -> str:
    try:
        return metadata.version("bc-workers")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0.0.0"


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def write(path: Path, registry: Registry = REGISTRY) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(document(registry)), encoding="utf-8")
    return path
