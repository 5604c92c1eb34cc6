"""`bcw events`: the events stream read with type and node filters (no consumer)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.client import Client as NATS

from schemas import REGISTRY, NodeConnected, NodeDisconnected
from schemas.subjects import Subjects
from tests.conftest import Servers
from workers.runtime.base.setting_types import parse_start
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
        sys.executable,
        "-m",
        "workers.cli",
        "events",
        "--all",
        "--json",
        "--type",
        "node.*",
        "--node",
        "n2",
        "--idle-exit",
        "1.5",
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
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
            *command,
            "--since",
            "yesterday",
            BCW_NATS_URL="nats://10.255.255.1:4222",
            BCW_DATABASE_URL="postgresql://x@10.255.255.1/x",
        )
        assert code == 2 and "yesterday" in out, out
        assert time.monotonic() - started < 10


async def test_a_subscriber_resumes_from_the_sequence_it_last_handled(
    servers: Servers, nc: NATS, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    seen_by_core: list[str] = []

    async def core(msg: object) -> None:
        seen_by_core.append(msg.headers["Nats-Msg-Id"])  # type: ignore[attr-defined]

    await nc.subscribe(subjects.event("node.*"), cb=core)
    events = [
        NodeDisconnected(node_id=f"n{i}", epoch=1, gateway_id="gw", reason="liveness-timeout")
        for i in range(1, 6)
    ]
    ids = [str(uuid.uuid4()) for _ in events]  # as the relay publishes them
    for event, msg_id in zip(events, ids, strict=True):
        body, headers = REGISTRY.encode(event)
        await js.publish(
            subjects.event(event.BC_TYPE), body, headers={**headers, "Nats-Msg-Id": msg_id}
        )
    # the relay re-publishes n3's after a failover: the stream keeps one, a core
    # subscription sees both
    body, headers = REGISTRY.encode(events[2])
    first_id = ids[2]
    await js.publish(
        subjects.event("node.disconnected"), body, headers={**headers, "Nats-Msg-Id": first_id}
    )
    await nc.flush()

    lines = await _lines(servers, subjects, "--all")
    assert [line["event"]["nodeId"] for line in lines] == ["n1", "n2", "n3", "n4", "n5"]
    assert [line["seq"] for line in lines] == sorted({line["seq"] for line in lines})
    assert [line["msgId"] for line in lines] == ids
    assert seen_by_core.count(first_id) == 2  # dedupe a core subscription by Nats-Msg-Id

    handled = lines[1]["seq"]  # the subscriber stopped after n2
    resumed = await _lines(servers, subjects, "--start-seq", str(handled + 1))
    assert [line["event"]["nodeId"] for line in resumed] == ["n3", "n4", "n5"]

    await js.purge_stream(subjects.events_stream, seq=lines[3]["seq"])  # past retention
    code, out, err = await _run(servers, subjects, "--start-seq", str(handled + 1))
    assert code == 0 and [json.loads(x)["event"]["nodeId"] for x in out.splitlines()] == [
        "n4",
        "n5",
    ]
    assert f"no longer holds events {handled + 1} to {lines[3]['seq'] - 1}" in err


async def test_a_bad_start_sequence_exits_2_before_any_connection() -> None:
    from tests.integration.support import bcw

    for bad in ("0", "-3", "next"):
        code, out = await bcw("events", "--start-seq", bad, BCW_NATS_URL="nats://10.255.255.1:4222")
        assert code == 2 and "not a stream sequence" in out, out
    code, out = await bcw(
        "events", "--start-seq", "5", "--all", BCW_NATS_URL="nats://10.255.255.1:4222"
    )
    assert code == 2 and "not allowed with" in out, out


async def _run(servers: Servers, subjects: Subjects, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "BCW_NATS_URL": servers.nats_url, "BCW_SUBJECT_ROOT": subjects.root}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers.cli",
        "events",
        "--json",
        "--idle-exit",
        "1",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    return proc.returncode or 0, out.decode(), err.decode()


async def _lines(servers: Servers, subjects: Subjects, *args: str) -> list[dict[str, Any]]:
    code, out, err = await _run(servers, subjects, *args)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]
