"""A continuous pull on a durable JetStream consumer: pull requests stay outstanding, so
facts stream in while the previous batch is applied.

Used by the consume loop instead of nats-py's `fetch()`, which waits a full round trip
per batch and arms a timer per message (measured: it bounds a process near 11k msg/s).
Each request has its own reply subject, so a terminal status (404, 408, 409) ends the
request it names; deliveries count against the oldest request (the server serves them
in order); a request that outlived its expiry (a lost connection) is forgotten. At most `window` messages are requested and not yet
taken, which keeps the process well under the consumer's `max_ack_pending`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

STATUS = "Status"
HEARTBEAT = "100"
NO_RESPONDERS = "503"
EXPIRED = "408"


@dataclass
class _Request:
    remaining: int
    expires_at: float


class ContinuousPull:
    def __init__(
        self,
        nc: NATS,
        stream: str,
        consumer: str,
        *,
        batch: int,
        window: int,
        expires: float = 2.0,
        on_message: Callable[[Msg], None] = lambda _msg: None,
        max_bytes: int = 0,
        linger: float = 0.0,
    ) -> None:
        """`on_message` is told of each delivery as it arrives (the consumer keeps it alive).

        `max_bytes` (0: unbounded) bounds memory whatever the facts carry: each request
        asks for at most that many bytes (at least one message of the largest the bus
        takes), a batch holds at most that many bytes (at least one message), and no new
        batch is handed out while the batches taken and not yet `done` hold twice that."""
        self._nc = nc
        self._max_bytes = max_bytes
        self._taken = 0  # bytes handed out and not yet done
        self._room = asyncio.Event()
        self._room.set()
        self._api = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._batch = batch
        self._window = max(window, batch)
        self._expires = expires
        self._buffer: deque[Msg] = deque()
        self._buffered = 0  # bytes in `_buffer`
        self._linger = linger
        self._arrived = asyncio.Event()
        self._full = asyncio.Event()  # `_buffer` holds a batch
        self._ended = asyncio.Event()  # a request expired or ran out of bytes
        self._requests: dict[str, _Request] = {}
        self._ids = itertools.count()
        self._inbox = ""
        self._sub: Subscription | None = None
        self._on_message = on_message
        self._unanswered = False  # a request found no consumer since `unanswered()` asked

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(
            f"{self._inbox}.*", cb=self._on_msg, pending_msgs_limit=4 * self._window + 1024
        )

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def quiesce(self, within: float) -> None:
        """Wait (at most `within` seconds) until no pull request is outstanding, still
        receiving: a stopping consumer then holds every message the server sent it, and
        can release them all, instead of leaving some to wait out `ack_wait`."""
        deadline = time.monotonic() + within
        while self._requests and time.monotonic() < deadline:
            now = time.monotonic()
            for reply_id, request in list(self._requests.items()):
                if request.expires_at < now:
                    del self._requests[reply_id]
            await asyncio.sleep(0.05)

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get(STATUS) if msg.headers else None
        if status is None:
            # a delivery carries its own subject, not the request's: the server serves
            # waiting requests in order, so it counts against the oldest one
            self._buffer.append(msg)
            self._buffered += len(msg.data)
            self._on_message(msg)
            self._arrived.set()
            if self._holds_a_batch():
                self._full.set()
            for reply_id, request in self._requests.items():
                request.remaining -= 1
                if request.remaining <= 0:
                    del self._requests[reply_id]
                break
        elif status != HEARTBEAT:  # 404 no messages, 408 expired, 409 ended otherwise
            self._requests.pop(msg.subject.rsplit(".", 1)[-1], None)
            # 503: nothing answers the consumer's subject; 409 Consumer Deleted
            description = (msg.headers or {}).get("Description", "").lower()
            self._unanswered |= status == NO_RESPONDERS or "deleted" in description
            if status == EXPIRED or "maxbytes" in description:
                # it ended as requests do (its time, or its bytes): a `next_batch` waiting
                # for facts asks again now, not once its wait is over
                self._ended.set()

    def unanswered(self) -> bool:
        """Whether a request found no consumer (it is missing or was deleted) since the
        last call."""
        found, self._unanswered = self._unanswered, False
        return found

    async def _top_up(self) -> None:
        now = time.monotonic()
        for reply_id, request in list(self._requests.items()):
            if request.expires_at < now:  # its terminal status never came (reconnect)
                del self._requests[reply_id]
        owed = sum(r.remaining for r in self._requests.values())
        while owed + len(self._buffer) + self._batch <= self._window:
            reply_id = str(next(self._ids))
            self._requests[reply_id] = _Request(self._batch, now + self._expires + 1.0)
            body: dict[str, int] = {"batch": self._batch, "expires": int(self._expires * 1e9)}
            if self._max_bytes:  # never below one message: a larger one would block the rest
                body["max_bytes"] = max(self._max_bytes, self._nc.max_payload + 65536)
            await self._nc.publish(
                self._api, json.dumps(body).encode(), reply=f"{self._inbox}.{reply_id}"
            )
            owed += self._batch

    async def next_batch(self, wait: float) -> list[Msg]:
        """Up to `batch` messages (and `max_bytes`); waits at most `wait` seconds for room
        and for the first; [] if none came."""
        if self._max_bytes and self._taken >= 2 * self._max_bytes:
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), wait)
            if not self._room.is_set():
                return []
        await self._top_up()
        await self._until(lambda: bool(self._buffer), self._arrived, wait)
        if self._linger and self._buffer:
            await self._until(self._holds_a_batch, self._full, self._linger)
        out: list[Msg] = []
        size = 0
        while self._buffer and len(out) < self._batch:
            more = len(self._buffer[0].data)
            if out and self._max_bytes and size + more > self._max_bytes:
                break
            out.append(self._buffer.popleft())
            size += more
        self._buffered -= size
        self._taken += size
        if out:
            await self._top_up()
        return out

    async def _until(self, done: Callable[[], bool], event: asyncio.Event, within: float) -> None:
        """Wait (at most `within` seconds) until `done()`, told by `event`; a request that
        ends meanwhile (expired, or its bytes served) is asked again at once: the facts
        behind it would otherwise wait on the server until `within` is over."""
        deadline = time.monotonic() + within
        while not done() and (left := deadline - time.monotonic()) > 0:
            event.clear()
            self._ended.clear()
            waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._ended.wait())]
            try:
                await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
            if self._ended.is_set() and not done():
                await self._top_up()

    def _holds_a_batch(self) -> bool:
        return len(self._buffer) >= self._batch or bool(
            self._max_bytes and self._buffered >= self._max_bytes
        )

    def done(self, msgs: Sequence[Msg]) -> None:
        """`msgs` (handed out by `next_batch`) are settled: their bytes make room."""
        self._taken -= sum(len(msg.data) for msg in msgs)
        if self._taken < 2 * self._max_bytes:
            self._room.set()
