"""JetStream publishes whose PubAcks come back on one reply subscription of ours.

Used by the outbox relay, which publishes a batch of rows pipelined and then waits for
their PubAcks. nats-py's `publish_async` does the same with a semaphore wait, a NUID and
a done-callback per message and a full JSON and dataclass decode per PubAck; measured on
the development machine it bounds a process near 10,000 publishes/s, where this path
reaches about 19,000. A PubAck is decoded only when it says something went wrong.

The futures resolve to None (stored, or a duplicate the stream already had: either way
the message is in the stream) or fail with the exception `publish_async` would raise, so
`errors.classify` judges them the same.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

NO_RESPONDERS = "503"


class AckedPublisher:
    """Publish to JetStream, each message's PubAck a future (see the module docstring)."""

    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._prefix = ""
        self._sub: Subscription | None = None
        self._futures: dict[str, asyncio.Future[None]] = {}
        self._tokens = itertools.count()

    async def _start(self) -> None:
        self._prefix = self._nc.new_inbox() + "."
        self._sub = await self._nc.subscribe(
            self._prefix + "*", cb=self._on_reply, pending_msgs_limit=1_000_000
        )

    async def publish(
        self, subject: str, body: bytes, headers: dict[str, str]
    ) -> asyncio.Future[None]:
        """Send one message; the future settles with its PubAck. A future that is given
        up on must be passed to `forget`."""
        if self._sub is None:
            await self._start()
        token = str(next(self._tokens))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futures[token] = future
        try:
            await self._nc.publish(subject, body, reply=self._prefix + token, headers=headers)
        except BaseException:
            del self._futures[token]
            raise
        return future

    def forget(self) -> None:
        """Drop the futures nobody waits for any more (timed out and cancelled)."""
        self._futures = {t: f for t, f in self._futures.items() if not f.done()}

    @property
    def pending(self) -> int:
        return len(self._futures)

    async def _on_reply(self, msg: Msg) -> None:
        future = self._futures.pop(msg.subject[len(self._prefix) :], None)
        if future is None or future.done():
            return
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
            future.set_exception(nats.js.errors.NoStreamResponseError())
            return
        data = msg.data
        if b'"error"' not in data:  # {"stream": …, "seq": …[, "duplicate": true]}
            future.set_result(None)
            return
        try:
            error = json.loads(data).get("error")
        except (ValueError, AttributeError) as bad:
            future.set_exception(nats.js.errors.APIError(description=f"bad PubAck: {bad}"))
            return
        if error is None:  # a stream whose name is "error", say
            future.set_result(None)
        else:
            future.set_exception(_refusal(error))


def _refusal(error: object) -> nats.js.errors.APIError:
    """The exception a PubAck's `error` names (`APIError.from_error` raises it)."""
    try:
        nats.js.errors.APIError.from_error(error)  # type: ignore[arg-type]
    except nats.js.errors.APIError as refused:
        return refused
    except (KeyError, TypeError):
        pass
    return nats.js.errors.APIError(description=f"PubAck error: {error!r}")
