"""`/healthz`, `/readyz` and `/metrics` on one port per process (a tiny HTTP/1.1 server).

Started by the process lifecycle; probes are callables owned by the lifecycle. Serves
GET only, closes each connection after the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

from workers.runtime.observability.metrics import CONTENT_TYPE

log = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[dict[str, bool]]]


class HealthServer:
    """`notes`: lines `/readyz` says after its checks, whatever they are (a warning an
    operator should see, not a reason to be unready)."""

    def __init__(
        self,
        port: int,
        ready: Probe,
        metrics: Callable[[], str],
        host: str = "0.0.0.0",
        notes: Callable[[], Iterable[str]] = tuple,
    ):
        self._port = port
        self._host = host
        self._ready = ready
        self._metrics = metrics
        self._notes = notes
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port)
        log.info("health and metrics on port %d", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while (line := await asyncio.wait_for(reader.readline(), 5)) not in (
                b"\r\n",
                b"\n",
                b"",
            ):
                del line  # headers are not used
            parts = request.decode("latin-1").split()
            method, path = (parts[0], parts[1].split("?")[0]) if len(parts) >= 2 else ("", "")
            status, body, ctype = await self._route(method, path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _route(self, method: str, path: str) -> tuple[str, bytes, str]:
        text = "text/plain; charset=utf-8"
        if method != "GET":
            return "405 Method Not Allowed", b"GET only\n", text
        if path == "/healthz":
            return "200 OK", b"ok\n", text
        if path == "/readyz":
            checks = await self._ready()
            lines = [f"{name} {'ok' if ok else 'FAIL'}" for name, ok in checks.items()]
            body = "".join(f"{line}\n" for line in (*lines, *self._notes())).encode()
            return ("200 OK" if all(checks.values()) else "503 Service Unavailable"), body, text
        if path == "/metrics":
            return "200 OK", self._metrics().encode(), CONTENT_TYPE
        return "404 Not Found", b"not found\n", text
