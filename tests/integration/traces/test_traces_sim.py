"""`bcw sim` traces its gateways whenever `OTEL_EXPORTER_OTLP_ENDPOINT` is set: against
`bcw run` workers (another process) each simulated Hello is one trace, from the gateway's
`Hello` span and its transaction's SQL to every worker's span, on a real OTLP receiver."""

from __future__ import annotations

import os

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.otlp import HttpReceiver
from tests.integration.support import bcw, eventually
from tests.integration.traces.test_traces import HELLO_WORKERS, _consumers, _spawn
from workers.runtime.bus import streams


@pytest.mark.slow
async def test_bcw_sim_exports_its_gateways_spans(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    with HttpReceiver() as receiver:
        await streams.provision_streams(nc.jetstream(), subjects)
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        workers = await _spawn(["all"], database_url, servers, subjects, otel)
        try:
            await eventually(lambda: _consumers(nc, subjects), within=60, what="five consumers")
            env = {
                **{k: "" for k in os.environ if k.startswith("OTEL_")},
                **otel,
                "BCW_NATS_URL": servers.nats_url,
                "BCW_DATABASE_URL": database_url,
                "BCW_SUBJECT_ROOT": subjects.root,
            }
            code, out = await bcw(
                "sim", "--scenario", "power-on", "--nodes", "3", "--gateways", "1", **env
            )
            assert code == 0, out

            async def traced() -> bool:
                spans = receiver.spans()
                hellos = {s.trace_id for s in spans if s.name == "Hello"}
                groups = {
                    (s.trace_id, s.attributes.get("messaging.consumer.group.name"))
                    for s in spans
                    if s.kind == "CONSUMER" and s.trace_id in hellos and s.name.endswith(".hello")
                }
                return len(hellos) >= 3 and len(groups) >= 3 * len(HELLO_WORKERS)

            await eventually(traced, within=60, what="each Hello's trace through the workers")
        finally:
            workers.terminate()
            await workers.wait()
    spans = receiver.spans()
    hellos = [s for s in spans if s.name == "Hello"]
    assert {s.service for s in hellos} == {"bcw-gateway"}
    for hello in hellos:
        trace = [s for s in spans if s.trace_id == hello.trace_id]
        assert [s.name for s in trace if not s.parent_id] == ["Hello"]
        sql = {s.attributes.get("db.stored_procedure.name") for s in trace if s.kind == "CLIENT"}
        assert "gateway_hello_desired" in sql  # the Hello transaction, in the Hello's trace
