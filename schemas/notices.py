"""Notices: what a worker tells one gateway, on `<root>.gw.<gateway_id>.<type>`.

Produced by the workers through the outbox; obeyed by the gateway named in the subject.
Snake_case, as in the session protocol. Pure data: no I/O here.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from schemas.base import Ident, Name, NodeId, SnakeMessage
from schemas.facts import NonNegative, Positive, SmallPositive


class Dispatch(SnakeMessage):
    """Deliver a command; the gateway delivers it only if its live session has `epoch`."""

    BC_TYPE = "dispatch"

    node_id: NodeId
    epoch: Positive
    command_id: UUID
    seq: Positive
    kind: Name
    lane: Name
    attempt: SmallPositive
    payload: dict[str, Any]
    signature: str | None = None


class Zombie(SnakeMessage):
    """The session at `epoch` is not current: drop the stream."""

    BC_TYPE = "zombie"

    node_id: NodeId
    epoch: Positive


class EventAck(SnakeMessage):
    """Events of `journal_id` up to `seq` are stored: the daemon may trim its journal."""

    BC_TYPE = "event-ack"

    node_id: NodeId
    journal_id: Ident
    seq: NonNegative


class HelloAgain(SnakeMessage):
    """The Hello fact of the session at `epoch` never reached the workers (JetStream lost
    it): publish it again, as it was (same fact id)."""

    BC_TYPE = "hello-again"

    node_id: NodeId
    epoch: Positive


NOTICE_TYPES: tuple[type[SnakeMessage], ...] = (Dispatch, Zombie, EventAck, HelloAgain)
