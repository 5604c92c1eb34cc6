"""`bcw migrate --wait` and `bcw run` wait for a database that is away, refusing, hanging
or not in DNS yet, to their bound: then `--wait` exits 1 (docs: 1 failed or
unreachable) with one line naming `BCW_DATABASE_URL`, and `bcw run` is alive, not ready,
and stops on SIGTERM with 0. A server that comes up during the wait is used: the command
succeeds.

What is real: the `bcw` command in subprocesses, the session's PostgreSQL and
nats-server, a TCP proxy before PostgreSQL that refuses and then lets through, a tiny
server that accepts and never answers."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from tests.conftest import Servers
from tests.integration.connecting.conftest import endpoint
from tests.integration.support import bcw, bcw_process
from workers.bench.proxy import Mode, TcpProxy
from workers.embedded.servers import free_port

BOUND = 4.0


@contextlib.asynccontextmanager
async def _unreachable(how: str) -> AsyncIterator[str]:
    if how == "closed port":
        yield f"postgresql://u:hunter2@127.0.0.1:{free_port()}/db"
    elif how == "accepts and hangs":
        async with endpoint() as port:  # accepts, and never says a word
            yield f"postgresql://u:hunter2@127.0.0.1:{port}/db"
    else:  # a name that does not resolve (yet): a Service not created, a DNS outage
        yield "postgresql://u:hunter2@bcw-no-such-host.invalid:5432/db"


WAYS = ["closed port", "accepts and hangs", "not in DNS"]


@pytest.mark.parametrize("how", WAYS)
async def test_migrate_wait_waits_to_its_bound_then_says_so_in_one_line(how: str) -> None:
    async with _unreachable(how) as url:
        started = time.monotonic()
        # a connect timeout above the bound: the bound still holds
        code, out = await asyncio.wait_for(
            bcw(
                "migrate",
                "--wait",
                f"{BOUND:g}s",
                BCW_DATABASE_URL=url,
                BCW_DATABASE_CONNECT_TIMEOUT="30",
            ),
            60,
        )
        took = time.monotonic() - started
    assert code == 1, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out, out
    assert lines[0].startswith("bcw migrate --wait: still waiting for the database: ")
    assert "BCW_DATABASE_URL" in lines[0] and "hunter2" not in out
    assert BOUND <= took < BOUND + 8, took  # waited to the bound, and no longer


async def test_migrate_wait_succeeds_when_a_refusing_server_comes_up(database_url: str) -> None:
    target = urlsplit(database_url)
    assert target.hostname and target.port
    proxy = await TcpProxy(target.hostname, target.port).start()
    await proxy.set_mode(Mode.REFUSE)
    try:
        url = proxy.url("postgresql", target.path, user="postgres")
        waiting = await bcw_process("migrate", "--wait", "60s", output=True, BCW_DATABASE_URL=url)
        await asyncio.sleep(3)
        assert waiting.returncode is None, "it did not wait"
        await proxy.set_mode(Mode.FORWARD)
        out, _ = await asyncio.wait_for(waiting.communicate(), 30)
    finally:
        await proxy.stop()
    assert waiting.returncode == 0, out.decode()
    assert "schema current" in out.decode()


@pytest.mark.parametrize("how", WAYS)
async def test_run_waits_for_a_database_it_cannot_reach_and_stops_on_sigterm(
    how: str, servers: Servers
) -> None:
    async with _unreachable(how) as url:
        process = await bcw_process(
            "run",
            "labeler",
            output=True,
            BCW_DATABASE_URL=url,
            BCW_NATS_URL=servers.nats_url,
            BCW_HEALTH_PORT="0",
            BCW_SUBJECT_ROOT=f"t{uuid.uuid4().hex[:10]}",
            BCW_DATABASE_CONNECT_TIMEOUT="1",
        )
        try:
            await asyncio.sleep(BOUND)
            assert process.returncode is None, "it did not wait"
        finally:
            process.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(process.communicate(), 20)
    text = out.decode()
    assert process.returncode == 0, text
    assert "waiting for PostgreSQL" in text and "BCW_DATABASE_URL" in text, text
    assert "Traceback" not in text and "hunter2" not in text
