"""Messages in hand: every fact message a consumer received and has not settled yet,
kept alive in JetStream while it waits.

Used by the consumer: the pull reports each delivery (`hold`), settling or releasing
forgets it (`drop`), and `keep_alive()` runs beside the lanes. It decides nothing about
the facts themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from nats.aio.msg import Msg


class InHand:
    """While a lane waits out an outage, its batch, the batches queued behind it and the
    pull's buffer would otherwise be redelivered after `ack_wait` (each redelivery
    counting towards `max_deliver`). `in_progress()` resets the ack timer without
    counting, so a message held a third of `ack_wait` is told it is still being worked on.
    """

    def __init__(self, ack_wait: float) -> None:
        self._period = ack_wait / 3
        self._held: dict[int, tuple[Msg, float]] = {}  # by id(msg): Msg is not hashable

    def hold(self, msg: Msg) -> None:
        self._held[id(msg)] = (msg, time.monotonic())

    def drop(self, msg: Msg) -> None:
        self._held.pop(id(msg), None)

    def __len__(self) -> int:
        return len(self._held)

    def take_all(self) -> list[Msg]:
        """Every message still held (forgotten here): to release them on the way out."""
        held = [msg for msg, _since in self._held.values()]
        self._held.clear()
        return held

    async def keep_alive(self) -> None:
        """Until cancelled: `in_progress()` for every message held a period or longer."""
        while True:
            await asyncio.sleep(self._period)
            now = time.monotonic()
            for key, (msg, since) in list(self._held.items()):
                if now - since >= self._period and key in self._held:
                    self._held[key] = (msg, now)
                    with contextlib.suppress(Exception):  # disconnected: redelivery is safe
                        await msg.in_progress()
