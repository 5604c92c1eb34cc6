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

#: `closed` facts a stopping gateway has in flight at once (each awaits its PubAck)
CLOSED_AT_ONCE = 64


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
        """Every session ended: their closes written first, a few statements for them all
        (`store.close_sessions`: the next Hello anywhere reads them as not live), then
        each stream dropped and its `closed` fact published, CLOSED_AT_ONCE at a time. One
        by one, a gateway of thousands took minutes to stop, its flush stopped meanwhile,
        and parsed its range rows once a session."""
        sessions = list(self.sessions.values())
        self.sessions.clear()
        if reason not in ROW_OF_ANOTHER:
            closing = [(s.node_id, s.epoch) for s in sessions]
            lease = self.lease_epoch or 0
            await store.close_sessions(self.pool, self.gateway_id, lease, closing, reason)
        at_once = asyncio.Semaphore(CLOSED_AT_ONCE)

        async def said(session: Session) -> None:
            session.stream.drop(reason, CLOSE_CODES[reason])
            async with at_once:
                try:
                    closed = self.facts.closed(session.node_id, session.epoch, reason)
                    await self.facts.publish(closed)
                except Exception as error:  # the liveness worker ages its row out
                    log.warning(
                        "gateway %s: closed of %s (%r)", self.gateway_id, session.node_id, error
                    )

        await asyncio.gather(*(said(s) for s in sessions))

    async def _closed(self, session: Session, reason: CloseReason) -> None:
        """Its fenced disconnect at once (unless a newer session owns the row), then the
        `closed` fact: the next Hello anywhere reads the session as not live."""
        if reason not in ROW_OF_ANOTHER:
            lease = self.lease_epoch or 0
            await store.close_session(
                self.pool, self.gateway_id, lease, session.node_id, session.epoch, reason
            )
        await self.facts.publish(self.facts.closed(session.node_id, session.epoch, reason))
