"""Valid messages on the wire (field names exactly as DESIGN §3 spells them), and helpers
that build facts for tests. Pure data."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from schemas import REGISTRY, Fact, Hello

NOW = "2026-11-30T12:00:00Z"
CMD = "6f1c2b7e-0d4a-4c59-9a59-2f0a3c1d9e01"


def fact_base(gateway_id: str = "gw-1") -> dict[str, Any]:
    return {"fact_id": str(uuid.uuid4()), "gateway_id": gateway_id, "observed_at": NOW}


def hello_wire(**overrides: Any) -> dict[str, Any]:
    wire = {
        **fact_base(),
        "node_id": "node-1",
        "session_id": "s-1",
        "epoch": 2,
        "role": "worker",
        "boot_id": "boot-b",
        "journal_id": "journal-1",
        "daemon_version": "1.4.0",
        "proto_max": 3,
        "trust_version": 5,
        "capabilities": ["nvml", "cuda.12"],
        "approver_set_epoch": 1,
        "approver_set_sha256": "ab" * 32,
        "running_command_ids": [CMD],
        "inventory_hashes": {"gpu": "h1"},
        "cert": {"serial": "serial-1", "allowed_kinds": ["exec"], "identity_generation": 1},
        "upgrade_required": False,
        "transport": "grpc",
        "previous": {
            "epoch": 1,
            "gateway_id": "gw-0",
            "boot_id": "boot-a",
            "journal_id": "journal-1",
            "live": True,
        },
    }
    wire.update(overrides)
    return wire


#: One valid body per registered (type, schema), as it appears on the wire.
WIRE_SAMPLES: dict[str, dict[str, Any]] = {
    "hello": hello_wire(),
    "liveness": {**fact_base(), "entries": [{"node_id": "node-1", "epoch": 2, "age_ms": 1500}]},
    "closed": {**fact_base(), "node_id": "node-1", "epoch": 2, "reason": "heartbeat-timeout"},
    "progress": {
        **fact_base(),
        "node_id": "node-1",
        "epoch": 2,
        "command_id": CMD,
        "state": "acked",
    },
    "result": {
        **fact_base(),
        "node_id": "node-1",
        "epoch": 2,
        "command_id": CMD,
        "outcome": "failed",
        "result": {"exit": 1},
        "error": "exit status 1",
    },
    "rejected": {
        **fact_base(),
        "node_id": "node-1",
        "epoch": 2,
        "command_id": CMD,
        "reason": "BUSY",
    },
    "events": {
        **fact_base(),
        "node_id": "node-1",
        "journal_id": "journal-1",
        "events": [{"seq": 1, "kind": "gpu.xid", "body": {"xid": 79}, "at": NOW}],
    },
    "status": {
        **fact_base(),
        "node_id": "node-1",
        "epoch": 2,
        "observed_generation": 7,
        "trust_version": 0,
        "approver_set_epoch": None,
        "approver_set_sha256": None,
    },
    "node.connected": {
        "nodeId": "node-1",
        "epoch": 2,
        "gatewayId": "gw-1",
        "bootId": "boot-b",
        "journalChanged": False,
        "bootChanged": True,
        "duplicateIdentity": True,
    },
    "node.disconnected": {
        "nodeId": "node-1",
        "epoch": 2,
        "gatewayId": "gw-1",
        "reason": "gateway-lost",
    },
    "node.capabilities-changed": {"nodeId": "node-1", "epoch": 2, "added": ["nvml"], "removed": []},
    "security.node.duplicate-session": {
        "nodeId": "node-1",
        "gatewayId": "gw-1",
        "previousBootId": "boot-a",
        "bootId": "boot-b",
        "alternations": 2,
        "windowSeconds": 600,
        "quarantined": False,
        "held": False,
    },
    "security.node.unproven-hello": {
        "nodeId": "node-1",
        "gatewayId": "gw-1",
        "epoch": 3,
        "bootId": "boot-x",
        "serial": "serial-1",
    },
    "security.node.quarantined": {
        "nodeId": "node-1",
        "reason": "duplicate-identity",
        "alternations": 4,
        "revokedSerials": ["serial-1"],
    },
    "security.quarantine.held": {
        "nodeId": "node-1",
        "gatewayId": "gw-1",
        "reason": "breaker",
        "alternations": 4,
        "gateways": ["gw-1", "gw-2"],
        "serials": ["serial-1"],
    },
    "security.quarantine.breaker-open": {"gatewayId": "gw-1", "revoked": 3, "windowSeconds": 600},
    "security.node.hold-expired": {
        "nodeId": "node-1",
        "epoch": 2,
        "gatewayId": "gw-1",
        "heldSeconds": 300.5,
    },
    **{
        name: {
            "commandId": CMD,
            "nodeId": "node-1",
            "epoch": 2,
            "seq": 3,
            "kind": "exec",
            "attempt": 2,
            "reason": "journal-lost" if name == "command.failed" else None,
        }
        for name in ("command.replayed", "command.cancelled", "command.failed", "command.completed")
    },
    "gateway.blind": {
        "gatewayId": "gw-1",
        "sessions": 40,
        "lastFlushAgeSeconds": 31.5,
        "reason": "lag",
    },
    "gateway.seeing": {"gatewayId": "gw-1", "sessions": 40, "lastFlushAgeSeconds": 0.2},
    "liveness.breaker-open": {"gatewayId": "gw-1", "wouldDisconnect": 30, "connected": 40},
    "revocations": {"nodeId": "node-1", "serials": ["serial-1"], "reason": "duplicate-identity"},
    "dispatch": {
        "node_id": "node-1",
        "epoch": 2,
        "command_id": CMD,
        "seq": 3,
        "kind": "exec",
        "lane": "default",
        "attempt": 1,
        "payload": {"argv": ["true"]},
        "signature": None,
    },
    "zombie": {"node_id": "node-1", "epoch": 2},
    "event-ack": {"node_id": "node-1", "journal_id": "journal-1", "seq": 41},
    "hello-again": {"node_id": "node-1", "epoch": 7},
}


def make_fact(bc_type: str, **overrides: Any) -> Fact:
    """A valid fact of `bc_type` with a fresh fact id, built through the registry."""
    import json

    wire = {**WIRE_SAMPLES[bc_type], **fact_base(overrides.pop("gateway_id", "gw-1")), **overrides}
    fact = REGISTRY.decode({"Bc-Type": bc_type}, json.dumps(wire, default=str).encode())
    assert isinstance(fact, Fact)
    return fact


def utcnow() -> datetime:
    return datetime.now(UTC)


def hello(node_id: str, epoch: int, **fields: Any) -> Hello:
    fields.setdefault("previous", {"epoch": epoch - 1, "live": False})
    fields.setdefault("running_command_ids", [])
    fields.setdefault("cert", {"serial": f"{node_id}-serial"})
    fact = make_fact("hello", node_id=node_id, epoch=epoch, **fields)
    assert isinstance(fact, Hello)
    return fact
