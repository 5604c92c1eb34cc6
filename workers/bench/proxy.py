"""A small TCP proxy that injects the faults a network does: cut every connection,
refuse new ones, or blackhole them (accept, then never answer).

Used by the fault tests and `bcw bench chaos`, between a worker and its NATS or
PostgreSQL server, in the caller's event loop. Not for production traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import socket

log = logging.getLogger(__name__)


class Mode(enum.Enum):
    FORWARD = "forward"
    """Pass bytes both ways."""
    REFUSE = "refuse"
    """Not listening: a connect is refused at once."""
    BLACKHOLE = "blackhole"
    """A partition: open connections go silent (bytes are dropped, nothing is reset) and
    new ones are accepted and held; a connect, a query or a ping waits for its timeout.
    When the link heals, what was open during the partition is reset."""


class TcpProxy:
    """Listens on 127.0.0.1:`port` (0 picks one) and forwards to `target_host:target_port`."""

    def __init__(self, target_host: str, target_port: int, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.port = port
        self.mode = Mode.FORWARD
        self._server: asyncio.Server | None = None
        self._holder: socket.socket | None = None  # the port, held while refusing
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._healed = asyncio.Event()
        self._healed.set()

    def url(self, scheme: str, path: str = "", user: str = "") -> str:
        at = f"{user}@" if user else ""
        return f"{scheme}://{at}127.0.0.1:{self.port}{path}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._release_port()  # listening again: the port is the listener's
        return self

    async def stop(self) -> None:
        await self._close_listener()
        self._release_port()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def cut(self) -> None:
        """Reset every open connection (both sides see the connection drop)."""
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    async def set_mode(self, mode: Mode) -> None:
        """Switch mode. REFUSE resets what is open; BLACKHOLE freezes it; back to FORWARD
        resets what lived through a partition (its peers have given up on it)."""
        if mode is Mode.REFUSE or (mode is Mode.FORWARD and self.mode is Mode.BLACKHOLE):
            self.cut()
        if mode is Mode.REFUSE:
            await self._close_listener()
            self._hold_port()
        elif self._server is None:
            await self.start()
        self.mode = mode
        if mode is Mode.BLACKHOLE:
            self._healed.clear()
        else:
            self._healed.set()
        log.info("proxy :%d -> %s:%d now %s", self.port, *self.target, mode.value)

    async def outage(self, seconds: float, mode: Mode = Mode.REFUSE) -> None:
        """The link is down for `seconds`, then forwards again."""
        await self.set_mode(mode)
        try:
            await asyncio.sleep(seconds)
        finally:
            await self.set_mode(Mode.FORWARD)

    def _hold_port(self) -> None:
        """Keep the port while refusing: a socket bound to it and not listening, so a
        connect is still refused, and no outgoing connection takes the port as its own
        meanwhile (one did, in a 90-second outage: the listener could not come back)."""
        if self._holder is None:
            holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.bind(("127.0.0.1", self.port))
            self._holder = holder

    def _release_port(self) -> None:
        if self._holder is not None:
            self._holder.close()
            self._holder = None

    async def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)
            self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if self.mode is not Mode.FORWARD:  # blackhole: hold it until cut
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink, writer, up_writer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        *pair: asyncio.StreamWriter,
    ) -> None:
        try:
            while data := await source.read(65536):
                if self.mode is Mode.BLACKHOLE:
                    await self._healed.wait()  # dropped; the connection dies with the partition
                    break
                if self.mode is not Mode.FORWARD:
                    break
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in pair:  # one side gone: the other goes too
                self._writers.discard(writer)
                with contextlib.suppress(Exception):
                    writer.transport.abort()
