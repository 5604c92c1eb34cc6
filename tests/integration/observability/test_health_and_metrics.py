"""The health port and `/metrics` as a scraper and a probe meet them, on real servers:
both address families, the exposition the request asks for (OpenMetrics with exemplars
naming the fact's trace), the NATS connection's losses and returns, and the PostgreSQL
pool's size and waits."""

from __future__ import annotations

import asyncio
import socket

from nats.aio.client import Client as NATS
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as prometheus

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import (
    build_tally,
    eventually,
    make_settings,
    publish_fact,
    running,
    status_fact,
    tally_rows,
)
from workers.bench.proxy import TcpProxy
from workers.runtime.observability import tracing

OPENMETRICS = "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5"


async def _get(
    host: str, port: int, path: str, accept: str = ""
) -> tuple[str, dict[str, str], str]:
    """(status line, headers, body) of one GET over a plain socket to `host`."""

    def fetch() -> bytes:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect((host, port))
            extra = f"Accept: {accept}\r\n" if accept else ""
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)

    raw = (await asyncio.to_thread(fetch)).decode()
    head, _, body = raw.partition("\r\n\r\n")
    status, *lines = head.split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


async def test_the_health_port_answers_over_ipv6_and_ipv4(
    servers: Servers, subjects: Subjects, tally_db: str
) -> None:
    settings = make_settings(servers.nats_url, tally_db, subjects)
    async with running(settings, [build_tally()]) as (_runtime, port):
        for host in ("::1", "127.0.0.1"):
            status, _, body = await _get(host, port, "/healthz")
            assert (status, body) == ("HTTP/1.1 200 OK", "ok\n"), host
            status, _, body = await _get(host, port, "/readyz")
            assert status == "HTTP/1.1 200 OK" and "consumers ok" in body, host


async def test_openmetrics_when_asked_with_exemplars_naming_the_facts_trace(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = make_settings(servers.nats_url, tally_db, subjects)
    async with running(settings, [build_tally()], provider=provider) as (_runtime, port):
        with provider.get_tracer("test").start_as_current_span(
            "gateway publish", kind=trace.SpanKind.PRODUCER
        ) as producer:
            await publish_fact(nc.jetstream(), subjects, status_fact(), headers=tracing.inject({}))
        await eventually(lambda: tally_rows(tally_db, 1), what="the fact")
        status, headers, body = await _get("127.0.0.1", port, "/metrics", OPENMETRICS)
        assert status == "HTTP/1.1 200 OK"
        assert headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
        assert body.endswith("# EOF\n")
        families = {f.name: f for f in openmetrics(body)}
        trace_id = f"{producer.get_span_context().trace_id:032x}"
        exemplars = [s.exemplar for s in families["bcw_fact_age_seconds"].samples if s.exemplar]
        assert exemplars and {e.labels["trace_id"] for e in exemplars} == {trace_id}
        # without asking: the Prometheus text format, no exemplar in it
        status, headers, body = await _get("127.0.0.1", port, "/metrics")
        assert headers["content-type"].startswith("text/plain")
        assert "# EOF" not in body and trace_id not in body
        assert "bcw_fact_age_seconds" in {f.name for f in prometheus(body)}


def _samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in prometheus(body)
        for s in family.samples
    }


async def test_nats_losses_and_returns_and_the_pools_figures_are_counted(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    host, _, port = servers.nats_url.removeprefix("nats://").rpartition(":")
    proxy = await TcpProxy(host, int(port)).start()
    try:
        settings = make_settings(proxy.url("nats"), tally_db, subjects)
        async with running(settings, [build_tally()]) as (_runtime, health):
            connection = (("connection", "bcw tally"),)
            await publish_fact(nc.jetstream(), subjects, status_fact())
            await eventually(lambda: tally_rows(tally_db, 1), what="the fact")
            proxy.cut()

            async def back() -> bool:
                samples = _samples((await _get("127.0.0.1", health, "/metrics"))[2])
                return samples.get(("bcw_nats_reconnects_total", connection), 0) >= 1

            await eventually(back, what="the reconnect counted")
            samples = _samples((await _get("127.0.0.1", health, "/metrics"))[2])
            assert samples[("bcw_nats_disconnects_total", connection)] >= 1
            assert samples[("bcw_db_pool_max", ())] == settings.database.pool_max == 4
            assert 1 <= samples[("bcw_db_pool_size", ())] <= 4
            assert 0 <= samples[("bcw_db_pool_idle", ())] <= samples[("bcw_db_pool_size", ())]
            assert samples[("bcw_db_pool_acquire_seconds_count", ())] >= 1
    finally:
        await proxy.stop()


async def test_an_acquire_that_waits_for_a_connection_is_timed(
    servers: Servers, tally_db: str
) -> None:
    """asyncpg has no hook for it: if an upgrade moves what `db._TimedPool` times, this
    fails."""
    from workers.runtime.base.runtime_settings import DatabaseSettings
    from workers.runtime.store import db

    waits: list[float] = []
    settings = DatabaseSettings(url=tally_db, pool_min=1, pool_max=1)
    pool = await db.create_pool(settings, on_acquire=waits.append)
    try:
        held = await pool.acquire()
        waiting = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await pool.release(held)
        await pool.release(await waiting)
        assert len(waits) == 2 and waits[0] < 0.1 <= 0.25 <= waits[1]
    finally:
        await pool.close()


async def test_a_health_port_in_use_is_refused_not_half_taken() -> None:
    """A port another process holds on IPv6 alone is refused (the process then exits 2
    naming BCW_HEALTH_PORT), never taken on IPv4 alone; so is one held on IPv4."""
    import pytest

    from workers.runtime.observability.health import HealthServer

    async def ready() -> dict[str, bool]:
        return {}

    holders = [
        socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=False),
        socket.create_server(("0.0.0.0", 0)),
    ]
    for taken in holders:
        with taken:
            port = taken.getsockname()[1]
            server = HealthServer(port, ready, lambda _accept: (b"", "text/plain"))
            with pytest.raises(OSError):
                await server.start()
            await server.stop()
