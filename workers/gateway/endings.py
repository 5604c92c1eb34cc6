"""How a gateway's sessions end: one (`_end`: its stream dropped, its close written, the
`closed` fact), all of them when the gateway stops (`_end_all`), or one the daemon closed
(`disconnect`). Mixed into `Gateway`."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from schemas.facts import CLOSE_CODES, ROW_OF_ANOTHER, CloseReason
from workers.gateway import store
from workers.gateway.facts import FactPublisher
from workers.gateway.types import Session

log = logging.getLogger(__name__)


class Endings:
    """The ends of a gateway's sessions (its state lives in `Gateway`)."""

    gateway_id: str
    pool: asyncpg.Pool
    sessions: dict[str, Session]
    facts: FactPublisher
    lease_epoch: int | None

    async def disconnect(
        self, node_id: str, epoch: int, reason: CloseReason = "stream-closed"
    ) -> None:
        session = self.sessions.get(node_id)
        if session is not None and session.epoch == epoch:
            del self.sessions[node_id]
            await self._closed(session, reason)

    async def _end(self, session: Session, reason: CloseReason) -> None:
        """Drop a session's stream and say so (`closed`), unless it ended meanwhile."""
        if self.sessions.get(session.node_id) is session:
            del self.sessions[session.node_id]
        session.stream.drop(reason, CLOSE_CODES[reason])
        await self._closed(session, reason)

    async def _end_all(self, reason: CloseReason) -> None:
        """Every session ended, as many at once as half the pool has connections (one by
        one, a gateway of thousands took minutes to stop, its flush stopped meanwhile; the
        other half for whatever shares the pool — a simulator's other gateways)."""
        at_once = asyncio.Semaphore(max(1, self.pool.get_max_size() // 2))

        async def end(session: Session) -> None:
            async with at_once:
                try:
                    await self._end(session, reason)
                except Exception as error:  # its row ages out; the others go on
                    log.warning(
                        "gateway %s: end of %s (%r)", self.gateway_id, session.node_id, error
                    )

        await asyncio.gather(*(end(s) for s in list(self.sessions.values())))

    async def _closed(self, session: Session, reason: CloseReason) -> None:
        """Its fenced disconnect at once (unless a newer session owns the row), then the
        `closed` fact: the next Hello anywhere reads the session as not live."""
        if reason not in ROW_OF_ANOTHER:
            lease = self.lease_epoch or 0
            await store.close_session(
                self.pool, self.gateway_id, lease, session.node_id, session.epoch, reason
            )
        await self.facts.publish(self.facts.closed(session.node_id, session.epoch, reason))
