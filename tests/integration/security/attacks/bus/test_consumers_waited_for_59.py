"""A principal whose consumer is not as `bcw provision` makes it (issue 59, item 8), on a
real nats-server that admits only the principals: a gateway whose notices consumer is
missing (not provisioned yet, or deleted under it) says so, waits, refusing Hellos
meanwhile, and follows it once made again; a worker whose durable differs from its
settings says what differs and waits, not ready, changing nothing, and binds once it is
made as its settings want. The attacks on those consumers: test_consumers_59.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import asyncpg
import nats.errors
import nats.js.errors
import pytest
from opentelemetry.sdk.trace import TracerProvider

from tests.integration.security.attacks.bus.test_consumers_59 import provisioned
from tests.integration.security.conftest import SUBJECTS, client_as, nats_as
from tests.integration.support import eventually, make_settings
from workers.gateway import Gateway, HelloRequest, notices
from workers.gateway.admission import Code
from workers.gateway.types import Refused
from workers.registry import WORKERS
from workers.runtime.bus import connection, streams
from workers.runtime.process import run_process

pytestmark = pytest.mark.slow

NOTICES, FACTS = SUBJECTS.gateway_stream, SUBJECTS.facts_stream


async def _gateway_acks(keys: Path, url: str, count: int) -> bool:
    async with client_as(keys, url, "admin") as (admin, _):
        with contextlib.suppress(Exception):
            info = await admin.jetstream().consumer_info(NOTICES, "gw-gw-1")
            return info.ack_floor.stream_seq >= count and info.num_ack_pending == 0
    return False


async def test_a_gateway_without_its_notices_consumer_says_so_waits_and_follows_it_once_made(
    keys: Path, secured: str, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """gw-1 starts, as itself, before `bcw provision` made its consumer: it starts, says
    the consumer is missing, and waits (no crash, no consumer made), refusing Hellos
    UNAVAILABLE meanwhile (no command would reach their sessions); once made, the
    notice waiting for it is obeyed and acked. Deleted under it, it says so again, and
    follows the consumer made again."""
    await provisioned(keys, secured)  # streams and the workers' consumers only
    caplog.set_level(logging.INFO, logger="workers.gateway.notices")
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    nc = await connection.connect(nats_as(keys, secured, "gateway-gw-1"), name="gw-1")
    gateway = Gateway("gw-1", pool, nc, SUBJECTS)
    admin_nc = await connection.connect(nats_as(keys, secured, "admin"), name="admin")
    js = admin_nc.jetstream()
    try:
        await gateway.start(autotick=None)

        async def said(what: str) -> bool:
            return any(
                what in r.getMessage() and "gw-gw-1" in r.getMessage() for r in caplog.records
            )

        await eventually(lambda: said("is missing"), what="the missing consumer said")
        assert gateway.alive
        # no session opens where no command would reach it: the seed's not-started refusal
        request = HelloRequest(
            node_id="n1", cert_serial="n1-serial", role="worker", boot_id="b1", journal_id="j1"
        )
        with pytest.raises(Refused) as refused:
            await gateway.hello(request, None)  # type: ignore[arg-type]
        assert refused.value.code is Code.UNAVAILABLE and refused.value.retry_after
        await js.publish(SUBJECTS.notice("gw-1", "zombie"), b"{}", headers={"Bc-Type": "zombie"})
        await asyncio.sleep(1.5)
        with pytest.raises(nats.js.errors.NotFoundError):  # the gateway made none
            await js.consumer_info(NOTICES, "gw-gw-1")

        await notices.provision(js, SUBJECTS, "gw-1")  # as `bcw provision` does
        await eventually(lambda: _gateway_acks(keys, secured, 1), what="the notice obeyed")
        await eventually(lambda: said("is back"), what="the consumer found said")
        assert gateway.notices.present

        caplog.clear()
        await js.delete_consumer(NOTICES, "gw-gw-1")
        await eventually(lambda: said("is missing"), what="the deleted consumer said")
        await js.publish(SUBJECTS.notice("gw-1", "zombie"), b"{}", headers={"Bc-Type": "zombie"})
        await notices.provision(js, SUBJECTS, "gw-1")
        await eventually(lambda: _gateway_acks(keys, secured, 2), what="followed again")
        assert gateway.alive
    finally:
        await gateway.stop(graceful=False)
        await nc.close()
        await admin_nc.close()
        await pool.close()


async def test_a_worker_binds_its_durable_only_as_provisioned_and_waits_meanwhile(
    keys: Path, secured: str, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`worker-liveness` starts while its durable differs from its settings (provisioned
    with a 60 s ack wait, its own 5 s): it says which consumer, what differs and that `bcw
    provision` makes it, and waits, not ready — no crash, nothing changed; deleted, it
    makes none; made as its settings want, it binds and runs."""
    await provisioned(keys, secured)  # the default settings: ack_wait 60 s
    caplog.set_level(logging.INFO, logger="workers.runtime.process")
    settings = make_settings(secured, database_url, SUBJECTS)
    settings = settings.model_copy(update={"nats": nats_as(keys, secured, "worker-liveness")})
    worker = WORKERS["liveness"](settings)
    stopping, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        run_process(
            settings,
            [worker],
            stopping=stopping,
            provider=TracerProvider(),
            on_ready=lambda *_: ready.set(),
        )
    )
    try:
        async with client_as(keys, secured, "admin") as (admin, _):
            js = admin.jetstream()

            async def said() -> bool:
                return any(
                    f"consumer liveness on {FACTS} differs from these settings: "
                    "ack_wait 60.0 (settings: 5.0)"
                    in r.getMessage()
                    and "`bcw provision` makes it" in r.getMessage()
                    for r in caplog.records
                )

            await eventually(said, what="what differs said")
            await asyncio.sleep(1.0)
            assert not ready.is_set() and not task.done()
            assert (await js.consumer_info(FACTS, "liveness")).config.ack_wait == 60.0
            await js.delete_consumer(FACTS, "liveness")
            await asyncio.sleep(1.5)
            with pytest.raises(nats.js.errors.NotFoundError):  # the worker made none
                await js.consumer_info(FACTS, "liveness")
            assert not ready.is_set() and not task.done()
            spec = worker.consumer_spec(SUBJECTS)
            await streams.ensure_consumer(js, FACTS, spec, settings.consumer)  # as provisioned
            await asyncio.wait_for(ready.wait(), 15)
    finally:
        stopping.set()
        await asyncio.wait_for(task, 15)
