"""`bcw events`: the events stream read with type and node filters (no consumer)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import UTC, datetime, timedelta

from nats.aio.client import Client as NATS

from schemas import REGISTRY, NodeConnected, NodeDisconnected
from schemas.subjects import Subjects
from tests.conftest import Servers
from workers.explain import parse_start
from workers.runtime.bus import streams


async def test_events_filters_by_type_and_node(
    servers: Servers, nc: NATS, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    for node in ("n1", "n2"):
        for event in (
            NodeConnected(
                node_id=node,
                epoch=1,
                gateway_id="gw",
                boot_id="b",
                journal_changed=False,
                boot_changed=False,
                duplicate_identity=False,
            ),
            NodeDisconnected(node_id=node, epoch=1, gateway_id="gw", reason="liveness-timeout"),
        ):
            body, headers = REGISTRY.encode(event)
            await js.publish(subjects.event(event.BC_TYPE), body, headers=headers)
    env = {**os.environ, "BCW_NATS_URL": servers.nats_url, "BCW_SUBJECT_ROOT": subjects.root}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers.cli", "events", "--all", "--json", "--type", "node.*",
        "--node", "n2", "--idle-exit", "1.5", env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    lines = [json.loads(line) for line in out.decode().splitlines()]
    assert [(e["type"], e["event"]["nodeId"]) for e in lines] == [
        ("node.connected", "n2"),
        ("node.disconnected", "n2"),
    ]
    assert lines[1]["event"]["reason"] == "liveness-timeout"


def test_parse_start_is_the_one_since_parser() -> None:
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    assert parse_start("10m", now) == now - timedelta(minutes=10)
    assert parse_start("90", now) == now - timedelta(seconds=90)  # as bcw explain reads it
    assert parse_start("1w", now) == now - timedelta(weeks=1)
    assert parse_start("2026-11-30T11:00:00+00:00") == datetime(2026, 11, 30, 11, tzinfo=UTC)
    assert parse_start("2026-11-30T11:00:00") == datetime(2026, 11, 30, 11, tzinfo=UTC)


async def test_a_bad_since_exits_2_before_any_connection() -> None:
    import time

    from tests.integration.support import bcw

    for command in (("events",), ("explain", "n1")):
        started = time.monotonic()
        code, out = await bcw(
            *command, "--since", "yesterday", BCW_NATS_URL="nats://10.255.255.1:4222",
            BCW_DATABASE_URL="postgresql://x@10.255.255.1/x",
        )  # fmt: skip
        assert code == 2 and "yesterday" in out, out
        assert time.monotonic() - started < 10
