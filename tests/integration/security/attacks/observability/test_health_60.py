"""Issue 60, item 8 (the health server on `::`, OpenMetrics when asked), attacked from any
address that reaches the health port — no login: the port is open to every address of both
families now, and `/metrics` reads the request's `Accept` header.

- **Headers without a bound** (found): the server kept every `Accept` line of a request, joined
  into one string, for as long as the client sends one within 5 s of the last. One
  connection that never ends its headers grows the process's memory (and copies the whole
  string at each line); six such connections for 15 s took a process from 44 MB to
  300 MB — past the relay's 256 Mi limit, near a worker's 512 Mi.
- **A traceback from a header** (found): `Accept: application/openmetrics-text; version=abc`, a
  header line over 64 KiB: the request gets no answer and the process logs
  "Unhandled exception in client_connected_cb" with a traceback, each time it is asked.

Each asserts the defended end state, fixed since: a request's line and headers are
bounded (16 KiB, then 431 unread), and an Accept version it cannot read gets the text
format. What
held is pinned too: IPv6 is served what IPv4 is, nothing but GET."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from workers.runtime.observability.health import HealthServer
from workers.runtime.observability.metrics import Metrics

pytestmark = pytest.mark.slow


async def _server() -> HealthServer:
    async def ready() -> dict[str, bool]:
        return {"nats": True, "database": True}

    server = HealthServer(0, ready, Metrics("0.4.0").exposition)
    await server.start()
    return server


async def _ask(port: int, head: bytes, host: str = "127.0.0.1") -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head)
        await writer.drain()
        return (await asyncio.wait_for(reader.read(), 10)).split(b"\r\n\r\n")[0]
    finally:
        writer.close()


async def test_a_request_whose_headers_never_end_is_cut_off() -> None:
    server = await _server()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /metrics HTTP/1.1\r\n")
        line = b"Accept: " + b"a" * 60_000 + b"\r\n"
        cut_off, answer = False, b""
        try:
            for _ in range(64):  # 16 MB of one header, in lines the server takes
                writer.write(line * 4)
                await asyncio.wait_for(writer.drain(), 30)
            writer.write(b"\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 60)
        except ConnectionError:
            cut_off = True  # what a bounded server does: it stops reading, it closes
        except TimeoutError:
            answer = b"(still reading)"
        finally:
            writer.close()
        # a bounded server closes (or refuses, 4xx) long before 16 MB of headers
        assert cut_off or answer.startswith(b"HTTP/1.1 4"), answer[:40]
    finally:
        await server.stop()


BAD_ACCEPT = {
    "version not a number": b"Accept: application/openmetrics-text; version=abc\r\n",
    "text/plain, bad version": b"Accept: text/plain; version=x.y\r\n",
    "a line over 64 KiB": b"Accept: " + b"a" * 70_000 + b"\r\n",
}


@pytest.mark.parametrize("header", BAD_ACCEPT.values(), ids=BAD_ACCEPT.keys())
async def test_no_header_makes_a_traceback(header: bytes, caplog: pytest.LogCaptureFixture) -> None:
    server = await _server()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            answer = await _ask(server.port, b"GET /metrics HTTP/1.1\r\n" + header + b"\r\n")
            for _ in range(30):  # the loop logs what a connection's handler raised, later
                if any(r.exc_info for r in caplog.records):
                    break
                await asyncio.sleep(0.1)
    finally:
        await server.stop()
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    assert answer.startswith(b"HTTP/1.1 ")  # some answer: 200 in the text format, or 4xx


async def test_ipv6_is_served_what_ipv4_is_and_nothing_but_get() -> None:
    """Held: the dual-stack socket serves `/healthz`, `/readyz`, `/metrics` alike on both
    families; any other method is 405; odd but valid Accept values get an answer."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    server = await _server()
    try:
        for host in ("127.0.0.1", "::1"):
            for path in ("/healthz", "/readyz", "/metrics"):
                assert (await _ask(server.port, f"GET {path} HTTP/1.1\r\n\r\n".encode(), host))[
                    :15
                ] == b"HTTP/1.1 200 OK", (host, path)
            for method in ("POST", "PUT", "DELETE", "CONNECT"):
                head = f"{method} /metrics HTTP/1.1\r\n\r\n".encode()
                assert (await _ask(server.port, head, host)).startswith(b"HTTP/1.1 405"), method
        for accept in (
            b"application/openmetrics-text; version=99.0.0",
            b"application/openmetrics-text; version=",
            b"application/openmetrics-text; escaping=bogus",
            b"*/*;q=0.1, application/openmetrics-text;q=0.9",
        ):
            head = b"GET /metrics HTTP/1.1\r\nAccept: " + accept + b"\r\n\r\n"
            assert (await _ask(server.port, head)).startswith(b"HTTP/1.1 200 OK"), accept
    finally:
        await server.stop()
