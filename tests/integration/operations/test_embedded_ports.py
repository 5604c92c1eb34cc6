"""A port chosen free can be taken before the embedded server binds it — by another test's
server, say, starting at the same moment. The server must then never pass for started
while someone else's answers on its port: a first start moves to another port, a restart
(whose clients know its port) says the port is taken."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import asyncpg
import nats
import pytest

from workers.embedded.ready import PortTaken
from workers.embedded.servers import EmbeddedNats, EmbeddedPostgres


@contextlib.contextmanager
def impostor(port: int | None = None) -> Iterator[int]:
    """A listener on `port` (or a free one) that greets every client as a nats-server
    named "someone-else" — what the old readiness check took for the embedded server."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port or 0))
    listener.listen(64)
    info = json.dumps({"server_id": "X", "server_name": "someone-else", "version": "2.14.0"})

    def greet() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                with client:
                    client.sendall(f"INFO {info}\r\n".encode())

    threading.Thread(target=greet, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


async def _server_name(url: str) -> str:
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        return str(nc._server_info["server_name"])
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def started_where_taken(
    make: Callable[[int], EmbeddedNats | EmbeddedPostgres],
) -> AsyncIterator[EmbeddedNats | EmbeddedPostgres]:
    """A server made for a port an impostor holds, started: on another port."""
    with impostor() as taken:
        server = make(taken)
        await asyncio.to_thread(server.start)
        try:
            assert server.port != taken
            yield server
        finally:
            server.stop()


async def test_nats_whose_port_is_taken_starts_on_another(tmp_path: Path) -> None:
    async with started_where_taken(
        lambda port: EmbeddedNats(tmp_path / "nats", port=port)
    ) as server:
        assert await _server_name(server.url) == server.name  # ours answers on it


async def test_nats_restarted_onto_a_taken_port_says_so(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats")
    await asyncio.to_thread(server.start)
    server.stop()
    with impostor(server.port), pytest.raises(PortTaken, match=f"port {server.port}: it is in use"):
        await asyncio.to_thread(server.start)  # its clients' URL must stay: no other port
    assert server.process is None


async def test_postgres_whose_port_is_taken_starts_on_another(tmp_path: Path) -> None:
    async with started_where_taken(
        lambda port: EmbeddedPostgres(tmp_path / "pg", port=port)
    ) as server:
        conn = await asyncpg.connect(server.url)
        try:
            data = await conn.fetchval("SHOW data_directory")
        finally:
            await conn.close()
    assert Path(data) == tmp_path / "pg" / "data"  # ours answers on it
