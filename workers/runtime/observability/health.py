"""`/healthz`, `/readyz` and `/metrics` on one port per process (a tiny HTTP/1.1 server).

Started by the process lifecycle; probes are callables owned by the lifecycle. Serves
GET only, closes each connection after the answer. Listens on every address of both
families (one dual-stack `::` socket, IPv4 only where the host has no IPv6), or on the
one `host` given. `/metrics` answers in the exposition the request's `Accept` asks for
(OpenMetrics, with exemplars, or Prometheus text).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable

log = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[dict[str, bool]]]
#: the `/metrics` body and its content type, for the request's `Accept` header
Exposition = Callable[[str], tuple[bytes, str]]


def listening_socket(port: int, host: str | None = None) -> socket.socket:
    """A bound socket for `port`: on `host` when given; else on every address, IPv6 and
    IPv4 on one dual-stack socket where the host has both, IPv4 alone where IPv6 is off
    (a kernel or container without it)."""
    if host is not None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host, port), family=family)
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
        except OSError as error:  # IPv6 off at run time: IPv4 below; a port in use is said
            if error.errno == errno.EADDRINUSE:
                raise
    return socket.create_server(("0.0.0.0", port))


TEXT = "text/plain; charset=utf-8"
#: The most a request's line and headers may take: a probe or a scrape sends a few hundred
#: bytes; more is refused unread, so no client holds a process's memory with headers.
HEAD_BOUND = 16 * 1024
END_OF_HEAD = (b"\r\n", b"\n", b"")


def _response(status: str, body: bytes, ctype: str = TEXT) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class HealthServer:
    """`notes`: lines `/readyz` says after its checks, whatever they are (a warning an
    operator should see, not a reason to be unready)."""

    def __init__(
        self,
        port: int,
        ready: Probe,
        metrics: Exposition,
        host: str | None = None,
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
        sock = listening_socket(self._port, self._host)
        try:
            self._server = await asyncio.start_server(self._serve, sock=sock)
        except BaseException:
            sock.close()
            raise
        log.info("health and metrics on port %d", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            answer = await self._answer(reader)
            writer.write(answer)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> bytes:
        """The whole response to one request; a request past `HEAD_BOUND` bytes of request
        line and headers (or a line past the reader's own limit) is refused 431, unread."""
        read = 0
        accept = ""
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            read += len(request)
            while (line := await asyncio.wait_for(reader.readline(), 5)) not in END_OF_HEAD:
                read += len(line)
                if read > HEAD_BOUND:
                    return _response("431 Request Header Fields Too Large", b"too long\n")
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "accept":  # the one header read
                    accept = f"{accept},{value.strip()}" if accept else value.strip()
        except ValueError:  # a line past the reader's limit (64 KiB)
            return _response("431 Request Header Fields Too Large", b"too long\n")
        parts = request.decode("latin-1").split()
        method, path = (parts[0], parts[1].split("?")[0]) if len(parts) >= 2 else ("", "")
        try:
            status, body, ctype = await self._route(method, path, accept)
        except Exception:  # a probe or an exposition that failed: said, not a dropped line
            log.exception("health server: %s %s failed", method, path)
            status, body, ctype = "500 Internal Server Error", b"error\n", TEXT
        return _response(status, body, ctype)

    async def _route(self, method: str, path: str, accept: str = "") -> tuple[str, bytes, str]:
        if method != "GET":
            return "405 Method Not Allowed", b"GET only\n", TEXT
        if path == "/healthz":
            return "200 OK", b"ok\n", TEXT
        if path == "/readyz":
            checks = await self._ready()
            lines = [f"{name} {'ok' if ok else 'FAIL'}" for name, ok in checks.items()]
            body = "".join(f"{line}\n" for line in (*lines, *self._notes())).encode()
            return ("200 OK" if all(checks.values()) else "503 Service Unavailable"), body, TEXT
        if path == "/metrics":
            body, ctype = self._metrics(accept)
            return "200 OK", body, ctype
        return "404 Not Found", b"not found\n", TEXT
