"""The frames a daemon sends on its stream after its Hello: heartbeats, inventory
sections, command progress, results, BUSY answers, journal events and status. Each
refreshes the session's last-seen; a frame without a session at that epoch is refused
(the first frame must be Hello). Mixed into `Gateway`."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import asyncpg
from pydantic import TypeAdapter, ValidationError

from schemas.facts import (
    MAX_INVENTORY_SECTIONS,
    Events,
    LoadAverage,
    NodeLoad,
    Progress,
    Rejected,
    Result,
    Status,
)
from schemas.registry import describe
from workers.gateway import store
from workers.gateway.admission import Code
from workers.gateway.facts import FactPublisher
from workers.gateway.inventory import agreed, section_problem, sections_to_request, to_apply
from workers.gateway.types import HeartbeatAck, Refused, Session

#: what a heartbeat's load may be: its NodeLoad, or a bare load average
_NODE_LOAD = TypeAdapter(NodeLoad)
_LOAD_AVERAGE: TypeAdapter[float] = TypeAdapter(LoadAverage)

log = logging.getLogger(__name__)


class Frames:
    """What a gateway does with a daemon's frames (its state lives in `Gateway`)."""

    gateway_id: str
    pool: asyncpg.Pool
    clock: Callable[[], float]
    wall: Callable[[], float]
    sessions: dict[str, Session]
    facts: FactPublisher
    lease_epoch: int | None
    _spawn: Callable[[Coroutine[Any, Any, None], str], None]

    def heartbeat(
        self,
        node_id: str,
        epoch: int,
        credits: Mapping[str, int] | None = None,
        *,
        load: NodeLoad | float | None = None,
        applied_generation: int | None = None,
        inventory_hashes: Mapping[str, str] | None = None,
    ) -> HeartbeatAck:
        """A heartbeat: the session was seen now. What it carries is optional, and what it
        leaves out keeps its last known value: `credits` (free per lane) and `load` (its
        NodeLoad; a bare number is a load average) go out with the next flush; a higher
        `applied_generation` goes out as a status fact then; `inventory_hashes` (every
        10th heartbeat) are compared with the stored ones. The answer carries the server
        time and the sections that differ: the daemon sends them (`inventory()`). Without
        a session at that epoch it is refused, like every frame, and so is a load the
        schema refuses (nothing of the heartbeat is kept)."""
        session = self._frame(node_id, epoch)  # refused without a session at that epoch
        if load is not None:  # checked here: a bad one is this frame's refusal, not a
            adapter = _NODE_LOAD if isinstance(load, dict) else _LOAD_AVERAGE
            try:  # failure of the flush of every session
                load = adapter.validate_python(load)
            except ValidationError as error:
                field, detail = describe(error)
                where = f"load.{field}" if field else "load"
                raise Refused(Code.INVALID_ARGUMENT, f"{where}: {detail}") from None
        if credits is not None:
            session.credits = dict(credits)
        if isinstance(load, dict):
            session.node_load, session.load = load, load["load_average"]
        elif load is not None:
            session.load = load
        if applied_generation is not None:
            session.applied_generation = max(session.applied_generation, applied_generation)
        wanted: tuple[str, ...] = ()
        if inventory_hashes is not None:
            session.reported = dict(inventory_hashes)
            held = session.held_hashes
            wanted = tuple(
                s
                for s in sections_to_request(inventory_hashes, session.inventory)
                if held.get(s) != inventory_hashes[s]
            )
            session.requested.update(wanted)
            if session.held_sections:  # sent before these hashes: they may agree now
                # (as this heartbeat told them: a later report replaces, never changes, them)
                self._spawn(self._apply_inventory(session, epoch, session.reported), "inventory")
        return HeartbeatAck(self.wall(), wanted)

    async def inventory(
        self, node_id: str, epoch: int, section: str, digest: str, body: Mapping[str, Any]
    ) -> None:
        """An inventory frame: a section the gateway asked for, or one the daemon pushes
        because it changed (one the store holds with that hash changes nothing). It is held
        until the stored and held sections agree with the hashes last reported, then the
        inventory is applied: every held section in one transaction, under the session's
        fence (a session no longer current writes nothing), at most
        `MAX_INVENTORY_SECTIONS` per node."""
        session = self._frame(node_id, epoch)
        problem = section_problem(section, digest, body)
        if problem is None and section not in session.requested:
            if session.inventory.get(section) == digest:
                return  # pushed, and stored as it is
            if section not in session.held_sections and (
                len(session.held_sections) >= MAX_INVENTORY_SECTIONS
            ):
                problem = f"more than {MAX_INVENTORY_SECTIONS} inventory sections held"
        if problem is not None:
            raise Refused(Code.INVALID_ARGUMENT, problem)
        session.requested.discard(section)
        session.held_sections[section] = (digest, dict(body))
        await self._apply_inventory(session, epoch)

    async def _apply_inventory(
        self, session: Session, epoch: int, reported: Mapping[str, str] | None = None
    ) -> None:
        """Store the held sections once they and the stored ones agree with the hashes
        reported (`reported`, else the last report); else keep holding them."""
        reported = session.reported if reported is None else reported
        held = session.held_hashes
        if not agreed(reported, session.inventory, held):
            return
        # what is held and not reported (yet) waits for the report that names it
        sections = [(s, *session.held_sections.pop(s)) for s in to_apply(reported, held)]
        if not sections:
            return
        lease = self.lease_epoch or 0
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                written = [
                    await store.write_section(
                        conn, self.gateway_id, lease, session.node_id, epoch, s, digest, body
                    )
                    for s, digest, body in sections
                ]
        except Exception as error:  # the next report asks for them again
            log.warning(
                "gateway %s: inventory of %s not applied (%r)",
                self.gateway_id,
                session.node_id,
                error,
            )
            return
        for (section, digest, _), stored in zip(sections, written, strict=True):
            if stored:
                session.inventory[section] = digest

    def _frame(self, node_id: str, epoch: int | None = None) -> Session:
        """A frame of an open stream (not the first): its session, seen now. A frame
        without a session at that epoch is refused: the first frame must be Hello."""
        session = self.sessions.get(node_id)
        if session is None or (epoch is not None and session.epoch != epoch):
            raise Refused(Code.INVALID_ARGUMENT, "no session: the first frame must be Hello")
        session.last_seen = self.clock()  # any frame says the daemon is there
        return session

    async def progress(self, node_id: str, epoch: int, command_id: uuid.UUID, state: str) -> None:
        self._frame(node_id, epoch)
        await self.facts.fact(
            Progress, node_id=node_id, epoch=epoch, command_id=command_id, state=state
        )

    async def result(
        self,
        node_id: str,
        epoch: int,
        command_id: uuid.UUID,
        outcome: str,
        result: dict[str, Any] | None,
        error: str | None,
    ) -> None:
        self._frame(node_id, epoch)
        await self.facts.fact(
            Result,
            node_id=node_id,
            epoch=epoch,
            command_id=command_id,
            outcome=outcome,
            result=result,
            error=error,
        )

    async def busy(self, node_id: str, epoch: int, command_id: uuid.UUID) -> None:
        self._frame(node_id, epoch)
        await self.facts.fact(
            Rejected, node_id=node_id, epoch=epoch, command_id=command_id, reason="BUSY"
        )

    async def events(self, node_id: str, journal_id: str, events: list[dict[str, Any]]) -> None:
        self._frame(node_id)
        await self.facts.fact(Events, node_id=node_id, journal_id=journal_id, events=events)

    async def status(
        self,
        node_id: str,
        epoch: int,
        observed_generation: int,
        trust_version: int = 0,
        approver_set_epoch: int | None = None,
        approver_set_sha256: str | None = None,
    ) -> None:
        """A status report (StatusReport): the generation applied, the trust version and
        the approver set the daemon holds (fields 10 and 11), published as it is."""
        self._frame(node_id, epoch)
        await self.facts.fact(
            Status,
            node_id=node_id,
            epoch=epoch,
            observed_generation=observed_generation,
            trust_version=trust_version,
            approver_set_epoch=approver_set_epoch,
            approver_set_sha256=approver_set_sha256,
        )
