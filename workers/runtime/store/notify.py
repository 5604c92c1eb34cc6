"""Wake-ups from PostgreSQL NOTIFY: a LISTEN connection that reconnects when it drops.

Used by the outbox relay and the dispatch loop; both also poll, so a notification lost
while the connection was down only delays them by one poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import asyncpg

from workers.runtime.base.runtime_settings import DatabaseSettings
from workers.runtime.base.waiting import sleep_or_stop
from workers.runtime.store import db

log = logging.getLogger(__name__)


class Listener:
    """Sets `wake` on every notification of `channels` (and after each reconnect)."""

    def __init__(
        self, database: DatabaseSettings, channels: Sequence[str], wake: asyncio.Event
    ) -> None:
        self._database = database
        self._channels = tuple(channels)
        self._wake = wake
        self.listening = False

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            conn: asyncpg.Connection | None = None
            try:
                conn = await db.connect(self._database)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                for channel in self._channels:
                    await conn.add_listener(channel, lambda *_args: self._wake.set())
                self.listening = True
                self._wake.set()  # something may have come while we were not listening
                await lost.wait()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.debug("listener on %s: %s", ",".join(self._channels), error)
            finally:
                self.listening = False
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=1)
            await sleep_or_stop(stopping, 1.0)
