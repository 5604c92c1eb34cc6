"""What follows a Welcome on a daemon's stream: the Ack of the done results its Hello
carried (stored now: the Hello fact that holds them was acknowledged by JetStream), then
the node's full desired state when the daemon is behind it (`admission.desired_state_due`)
— both before anything the replay sends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from uuid import UUID

from workers.gateway.admission import DesiredState
from workers.gateway.types import DaemonStream

log = logging.getLogger(__name__)

_following: set[asyncio.Task[None]] = set()


def follow(stream: DaemonStream, acked: Sequence[UUID], desired: DesiredState | None) -> None:
    """Send, right after the Welcome the caller is returning, what follows it."""
    if not acked and desired is None:
        return
    task = asyncio.create_task(_send(stream, tuple(acked), desired))
    _following.add(task)
    task.add_done_callback(_following.discard)


async def _send(stream: DaemonStream, acked: Sequence[UUID], desired: DesiredState | None) -> None:
    await asyncio.sleep(0)  # the Welcome first: the daemon has read it when these arrive
    try:
        if acked:
            await stream.ack_results(acked)
        if desired is not None:
            await stream.desired_state(desired)
    except Exception as error:  # the stream ended meanwhile: the next Hello says it again
        log.debug("what follows a Welcome was not sent: %r", error)
