"""What the trace tests share: an environment without the runner's `OTEL_*` variables,
and the reference gateway exporting its spans as those variables say."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider

from schemas.subjects import Subjects
from tests.integration.fleet import Provisioned
from workers.runtime.observability import sql, tracing


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No `OTEL_*` variable is set; the test sets its own on what this yields."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    yield monkeypatch


@contextlib.asynccontextmanager
async def traced_gateway(
    otel_env: pytest.MonkeyPatch,
    otel: dict[str, str],
    database_url: str,
    nc: NATS,
    subjects: Subjects,
    pool_size: int,
) -> AsyncIterator[tuple[Provisioned, TracerProvider]]:
    """Gateway `gw-a`, started, its spans (its SQL's too) exported as `otel` (set in the
    environment) says; its tracer provider, to flush. Stopped and shut down on leaving."""
    for name, value in otel.items():
        otel_env.setenv(name, value)
    provider = tracing.build_provider("bcw-gateway")
    assert isinstance(provider, TracerProvider)
    tracer = tracing.tracer(provider)
    pool = await asyncpg.create_pool(
        database_url, min_size=1, max_size=pool_size, init=sql.SqlSpans(tracer).install
    )
    gateway = Provisioned("gw-a", pool, nc, subjects, tracer=tracer)
    try:
        await gateway.start()
        yield gateway, provider
    finally:
        await gateway.stop(graceful=False)
        await pool.close()
        provider.shutdown()
