"""Review of issue #60 (shows a defect; expected to FAIL until fixed): the first round
over several NATS servers is given up at the first server that refuses us
(`bus.connection.connect`: the error callback sets `never` on any error `errors.reach`
does not take as "not yet"), though another server of the same list takes us. Before
#60 nats-py went on to the next server and connected. So a process whose `BCW_NATS_URL`
lists a cluster's servers exits 3 (or 2, for one server's certificate) whenever the
server it happens to try first has not yet reloaded `auth.conf` (a rolling config
reload after `bcw auth nats`, a new gateway or subscriber principal) — a setting that
does work, on the servers that have it.

Real: the session's nats-server (no auth), and beside it a tiny server that speaks
NATS's greeting and refuses every CONNECT as nats-server does ("Authorization
Violation"). nats-py picks the first server at random: tried 8 times, the refusing one
comes first in almost every run. And one URL before a cluster (a Kubernetes Service, the
chart's `nats.url`): nats-py's second try is a new connection, which the Service may send
to a pod that takes us; #60 gives up after the first. Both pass on 8498986."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tests.conftest import Servers
from workers.runtime.base.errors import SettingError
from workers.runtime.base.runtime_settings import NatsSettings
from workers.runtime.bus import connection

INFO = (
    b'INFO {"server_id":"refuser","server_name":"refuser","version":"2.12.0","proto":1,'
    b'"host":"127.0.0.1","port":4222,"headers":true,"auth_required":true,'
    b'"max_payload":1048576}\r\n'
)


@contextlib.asynccontextmanager
async def _refusing_server() -> AsyncIterator[int]:
    """A server that greets as nats-server and refuses the CONNECT."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(INFO)
        await writer.drain()
        with contextlib.suppress(Exception):
            await reader.readline()  # CONNECT {...}
            writer.write(b"-ERR 'Authorization Violation'\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


async def test_a_server_of_the_list_that_takes_us_is_used(servers: Servers) -> None:
    async with _refusing_server() as port:
        url = f"nats://127.0.0.1:{port},{servers.nats_url}"
        outcomes = []
        for _ in range(8):
            try:
                nc = await connection.connect(
                    NatsSettings(url=url, connect_timeout=2.0), name="review"
                )
            except SettingError as error:
                outcomes.append(f"exit {error.exit_code}: {error}")
            else:
                outcomes.append("connected")
                await nc.close()
    assert outcomes == ["connected"] * 8, outcomes


@contextlib.asynccontextmanager
async def _service(real: str) -> AsyncIterator[int]:
    """One address before two servers, as a Kubernetes Service before a cluster's pods
    (kube-proxy picks one per connection): the first connection goes to a server that
    refuses us (one pod has not reloaded `auth.conf` yet), the next ones to the real one."""
    host, port = real.removeprefix("nats://").rsplit(":", 1)
    count = 0

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        if count == 1:
            writer.write(INFO)
            await writer.drain()
            with contextlib.suppress(Exception):
                await reader.readline()
                writer.write(b"-ERR 'Authorization Violation'\r\n")
                await writer.drain()
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


async def test_one_url_before_a_cluster_takes_the_next_connection(servers: Servers) -> None:
    async with _service(servers.nats_url) as port:
        nc = await connection.connect(
            NatsSettings(url=f"nats://127.0.0.1:{port}", connect_timeout=2.0), name="review"
        )
        assert nc.is_connected
        await nc.close()
