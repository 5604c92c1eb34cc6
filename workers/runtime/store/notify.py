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


#: at most one wake-up per this many seconds: any login may NOTIFY any channel, and a
#: storm of them would otherwise wake a loop for a round each (the first of a quiet spell
#: wakes it at once; the rest of its 50 ms, once, at its end)
DEBOUNCE = 0.05
#: a query on the LISTEN connection at least this often (seconds): it waits idle for
#: notifications, and the worker logins' `idle_session_timeout` (`limits`) would end it
KEEPALIVE = 60.0


class Listener:
    """Sets `wake` on notifications of `channels` — at once, then at most once per
    `debounce` seconds however many come — and after each reconnect."""

    def __init__(
        self,
        database: DatabaseSettings,
        channels: Sequence[str],
        wake: asyncio.Event,
        debounce: float = DEBOUNCE,
        keepalive: float = KEEPALIVE,
    ) -> None:
        self._database = database
        self._channels = tuple(channels)
        self._wake = wake
        self._debounce = debounce
        self._keepalive = keepalive
        self._last = -debounce
        self._later: asyncio.TimerHandle | None = None
        self.listening = False
        #: notifications received, and wake-ups they made (a storm shows as many to few)
        self.notified = 0
        self.woken = 0
        self.connects = 0  # connections made (each after the first: one that dropped)

    def _notified(self, *_args: object) -> None:
        self.notified += 1
        if self._later is not None:
            return  # a wake-up is due at the end of the spell
        loop = asyncio.get_running_loop()
        wait = self._last + self._debounce - loop.time()
        if wait <= 0:
            self._set()
        else:
            self._later = loop.call_later(wait, self._set)

    def _set(self) -> None:
        self._later = None
        self._last = asyncio.get_running_loop().time()
        self.woken += 1
        self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            conn: asyncpg.Connection | None = None
            try:
                conn = await db.connect(self._database)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                for channel in self._channels:
                    await conn.add_listener(channel, self._notified)
                self.listening = True
                self.connects += 1
                self._wake.set()  # something may have come while we were not listening
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._keepalive):
                            await lost.wait()
                    if not lost.is_set():
                        await conn.fetchval("SELECT 1")  # not idle for idle_session_timeout
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.debug("listener on %s: %s", ",".join(self._channels), error)
            finally:
                self.listening = False
                if self._later is not None:
                    self._later.cancel()
                    self._later = None
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=1)
            await sleep_or_stop(stopping, 1.0)
