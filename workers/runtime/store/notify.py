"""Wake-ups from PostgreSQL NOTIFY: a LISTEN connection that reconnects when it drops.

Used by the outbox relay and the dispatch loop; both also poll, so a notification lost
while the connection was down only delays them by one poll.

`pg_notify` is PUBLIC: any login may NOTIFY any channel, and each notification costs a
listener tens of microseconds however it is folded. So a listener LISTENs on channels no
other login can name — `wake_channels` (migration 0057) names each with a secret of the
database that only the owner and the workers' groups read — and a storm from a login
that can (a worker's) is shed: past `STORM` notifications in a second, the listener
stops listening for `REST` seconds, polling meanwhile (docs/runtime.md, "Wake-ups").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import asyncpg

from workers.runtime.base.runtime_settings import DatabaseSettings
from workers.runtime.base.waiting import sleep_or_stop, wait_any
from workers.runtime.store import db

log = logging.getLogger(__name__)


#: at most one wake-up per this many seconds: a storm of notifications would otherwise
#: wake a loop for a round each (the first of a quiet spell wakes it at once; the rest of
#: its 50 ms, once, at its end)
DEBOUNCE = 0.05
#: a query on the LISTEN connection at least this often (seconds): it waits idle for
#: notifications, and the worker logins' `idle_session_timeout` (`limits`) would end it
KEEPALIVE = 60.0
#: notifications in one second past which a listener stops listening (an honest writer
#: sends at most one a transaction, and the outbox's, one a statement: far fewer)
STORM = 2000
#: seconds a listener stays deaf after a storm (its loop polls meanwhile)
REST = 5.0

#: the channels' names (migration 0057): read at each connect, never guessed
CHANNELS = "SELECT name, channel FROM wake_channels WHERE name = ANY($1::text[])"


class Listener:
    """Sets `wake` on notifications of the wake-up channels named `names` (`wake_channels`)
    — at once, then at most once per `debounce` seconds however many come — and after each
    reconnect; past `storm` notifications in a second, deaf for `rest` seconds."""

    def __init__(
        self,
        database: DatabaseSettings,
        names: Sequence[str],
        wake: asyncio.Event,
        debounce: float = DEBOUNCE,
        keepalive: float = KEEPALIVE,
        storm: int = STORM,
        rest: float = REST,
    ) -> None:
        self._database = database
        self._names = tuple(names)
        self._wake = wake
        self._debounce = debounce
        self._keepalive = keepalive
        self._storm = storm
        self._rest = rest
        self._last = -debounce
        self._later: asyncio.TimerHandle | None = None
        self._second = (-1.0, 0)  # (when the current second began, notifications in it)
        self._deaf: asyncio.Event | None = None
        self._conn: asyncpg.Connection | None = None
        self.listening = False
        #: notifications received, and wake-ups they made (a storm shows as many to few)
        self.notified = 0
        self.woken = 0
        self.connects = 0  # connections made (each after the first: one that dropped)
        #: times it stopped listening for a storm
        self.shed = 0

    def _notified(self, *_args: object) -> None:
        self.notified += 1
        if self._deaf is not None:
            now = asyncio.get_running_loop().time()
            began, seen = self._second
            if now - began >= 1.0:
                began, seen = now, 0
            self._second = (began, seen + 1)
            if seen + 1 > self._storm and not self._deaf.is_set():
                self.shed += 1
                self._deaf.set()  # `run` stops listening
                if self._conn is not None:  # at once: what the socket holds is not read
                    self._conn.terminate()
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
            deaf = self._deaf = asyncio.Event()
            try:
                conn = self._conn = await db.connect(self._database)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                channels = dict(await conn.fetch(CHANNELS, list(self._names)))
                missing = set(self._names) - set(channels)
                if missing:
                    raise LookupError(f"no wake-up channel named {', '.join(sorted(missing))}")
                for name in self._names:
                    await conn.add_listener(channels[name], self._notified)
                self.listening = True
                self.connects += 1
                self._wake.set()  # something may have come while we were not listening
                while not lost.is_set() and not deaf.is_set():
                    await wait_any((lost, deaf), self._keepalive)
                    if not lost.is_set() and not deaf.is_set():
                        await conn.fetchval("SELECT 1")  # not idle for idle_session_timeout
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.debug("listener on %s: %s", ",".join(self._names), error)
            finally:
                self.listening = False
                self._deaf = self._conn = None
                if self._later is not None:
                    self._later.cancel()
                    self._later = None
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=1)
            if deaf.is_set():
                log.warning(
                    "listener on %s: over %d notifications in a second: deaf for %.0f s "
                    "(polling meanwhile)",
                    ",".join(self._names),
                    self._storm,
                    self._rest,
                )
                self._wake.set()
            await sleep_or_stop(stopping, self._rest if deaf.is_set() else 1.0)
